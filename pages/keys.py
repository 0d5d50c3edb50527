"""Keys: cache keys shared by several request identities, and who shared each one."""

from __future__ import annotations

import json

import plotly.express as px
import streamlit as st

import ui
from specdec_core import analysis, contract, keys, remediation
from specdec_core.config import ConfigError
from specdec_core.keys import audit

ui.page_header("Keys")
ui.require_data()
filters = ui.filters()

head = ui.cached(analysis.headline, filters=filters)
st.caption(f"{ui.plural(head.unique_keys, 'unique cache key')} for "
           f"{ui.plural(head.unique_identities, 'unique request identity', 'unique request identities')} in this selection. A correct key gives each identity a key of its own.")
collisions = ui.cached(analysis.key_collisions, filters=filters)
if collisions.empty:
    st.success("No cache key was shared by different request identities in this selection.")
else:
    st.subheader(f"{ui.plural(head.key_collisions, 'key')} shared by more than one identity")
    # How many keys each number of identities shares, per deployment: twenty bars of the top keys were all
    # 6 or 7 long and said nothing; the spread says whether a few keys or all of them mix identities.
    spread = (collisions.assign(label=[ui.plot_label(ui.deployment_label(d)) for d in collisions.deployment])
              .groupby(["label", "identities"], as_index=False).size().rename(columns={"size": "keys"}))
    figure = px.bar(spread, x="identities", y="keys", color="label", barmode="group",
                    category_orders={"label": sorted(spread.label.unique())}, color_discrete_sequence=ui.PALETTE,
                    labels={"identities": "identities sharing the key", "keys": "keys", "label": "deployment"},
                    height=320)
    figure.update_traces(hovertemplate="<b>%{fullData.name}</b><br>%{y:,} keys shared by %{x} identities"
                                       "<extra></extra>")
    figure.update_xaxes(dtick=1)
    st.caption("Each bar: how many keys that many identities share (with a correct key, one); the table lists "
               "each key.")
    st.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="identities_per_key", config=ui.CHART_CONFIG)
    table = ui.table(collisions, on_select="rerun", selection_mode="single-row",
                         key="collision_table")
    rows = [i for i in table.selection.rows if i < len(collisions)]
    chosen = collisions.iloc[rows[0] if rows else 0]

    st.subheader("Identities behind one key")
    st.caption("Select a row above to see another key. Showing:")
    st.code(f"deployment: {ui.deployment_label(chosen.deployment)}\ncache_key:  {chosen.cache_key}", language=None)
    identities = ui.cached(analysis.key_collision_identities, chosen.deployment, chosen.cache_key, filters=filters)
    differing = analysis.differing_identity_columns(identities)
    if differing:
        st.markdown("Identity fields that differ between them (highlighted): "
                    + ", ".join(ui.code_span(f) for f in differing))
    # The highlighted differing fields first: in view without scrolling sideways.
    identities = identities[differing + [c for c in identities.columns if c not in differing]]
    # The link to its first request right after the differing fields, which stay first.
    identities.insert(len(differing), "open", [ui.request_url(r) for r in identities.first_request_id])
    ui.table(identities, highlight=differing, key="key_identities", column_config={"open": ui.request_link_column()})
    prompts = ui.cached(analysis.key_prompts, chosen.deployment, chosen.cache_key, filters=filters)
    distinct = prompts.prompt.dropna().unique()
    st.markdown(f"**Prompt{'s' if len(distinct) > 1 else ''} behind this key**")
    for prompt in distinct[:3]:
        st.code(prompt, language=None, wrap_lines=True)
    if len(distinct) > 3:
        st.caption(f"and {ui.plural(len(distinct) - 3, 'more prompt')}.")
    if prompts.prompt.isna().any():
        st.caption("Some identities were logged with only the prompt's hash.")

st.subheader("Remediate")
plan = ui.cached(remediation.purge_plan, filters=filters)
if not plan:
    st.success("Nothing to purge: no key in this selection served a contaminated hit or several identities.")
else:
    counts = remediation.plan_counts(plan)
    row = st.columns(3)
    row[0].metric("Keys to purge", ui.fmt_int(counts.keys))
    row[1].metric("Served contaminated hits", ui.fmt_int(counts.contaminated),
                  help="Keys that served at least one hit produced for another identity")
    row[2].metric("Shared, none seen served", ui.fmt_int(counts.collision),
                  help="Keys several identities shared, without a contaminated hit in the log yet")
    plan_file = f"specdec-purge-plan_{ui.filter_slug(filters)}.jsonl"
    st.download_button("Download the purge plan (JSONL)", data=remediation.plan_jsonl(plan), file_name=plan_file,
                       mime="application/jsonl", on_click="ignore", key="download_plan")
    st.caption("This dashboard never connects to a production cache. From a shell that can reach it: a dry run "
               "first, then the purge with a backup (`specdec cache restore` puts it back). A service whose "
               "Redis key wraps the logged key: `specdec cache plan --key-template`; see docs/remediation.md.")
    st.code(remediation.purge_command(plan_file, dry_run=True) + "\n"
            + remediation.purge_command(plan_file, backup="purge-backup.jsonl", db=str(ui.store().path)),
            language="bash", wrap_lines=True)

st.subheader("Audit a key function")
st.caption("Changes every field of an example request and reports the fields the key ignores, and keys that "
           "depend on dict order, on the process (Python's built-in hash) or on earlier calls. "
           "`specdec audit-key MODULE:FUNCTION --example FILE.json` runs the same check in CI.")
SCHEMES = {"our full key": "full", "prompt only (the classic bug)": "prompt_only", "model + prompt": "model_prompt"}
OWN = "a function of yours (module:function)"
choice = st.radio("Key function", [*SCHEMES, OWN], horizontal=True, key="audit_choice")
if choice == OWN:
    # Auditing imports and calls the function; the dashboard has no login, so it runs only what the
    # operator listed. The CLI (`specdec audit-key`) audits any function, as `python -m` would run it.
    try:
        allowed = ui.dashboard_settings().audit_functions
    except ConfigError as exc:
        allowed = ()
        st.error(f"Can't read the dashboard settings: {ui.md_escape(exc)}")
    st.caption("Only the functions listed in the config's `[dashboard] audit_functions` can be audited here: "
               + (", ".join(ui.md_escape(name) for name in allowed) if allowed else "none are listed")
               + ". Any other: `specdec audit-key MODULE:FUNCTION` in a shell.")
    target = st.text_input("module:function, listed in [dashboard] audit_functions", key="audit_target",
                           on_change="ignore")
else:
    target = ""
# Both read by the button only: committing one reran the page while the click whose blur committed it was under
# way, and that click could be lost. Committed, they wait for it (as the Replay page's batch count).
example_text = st.text_area("Example request (JSON object)", value=json.dumps(keys.EXAMPLE_REQUEST, indent=2),
                            height=260, key="audit_example", on_change="ignore")
if st.button("Audit", key="audit_run"):
    try:
        example = json.loads(example_text)
        if not isinstance(example, dict):
            raise ValueError("the example must be a JSON object")
        if choice == OWN:
            settings = ui.dashboard_settings()
            if not settings.may_audit(target.strip()):
                raise audit.KeyAuditError(
                    f"{target.strip() or 'an empty name'} is not listed in [dashboard] audit_functions of "
                    f"{settings.source or 'specdec.toml'}: this dashboard imports and runs only the key "
                    "functions its operator listed there (use `specdec audit-key` in a shell for any other)")
            key_fn, importable = audit.resolve_importable(target.strip()), target.strip()
        else:
            key_fn, importable = keys.dict_key_adapter(SCHEMES[choice]), None
        with st.spinner("Auditing (the process check starts two interpreters)"):
            result = audit.audit_key_function(key_fn, example, ignore=contract.NON_IDENTITY_FIELDS,
                                              importable=importable)
    except (ValueError, ImportError, AttributeError, audit.KeyAuditError, ConfigError) as exc:
        st.error(f"Can't audit: {ui.md_escape(exc)}")
    else:
        verdict = st.columns(3)
        verdict[0].metric("Verdict", "covers the request" if result.ok else "findings")
        verdict[1].metric("Fields the key ignores", len(result.missing))
        verdict[2].metric("Instabilities", len(result.unstable))
        st.code(str(result), language=None, wrap_lines=True)
