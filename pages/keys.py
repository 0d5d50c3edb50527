"""Keys: cache keys shared by several request identities, and who shared each one."""

from __future__ import annotations

import streamlit as st

import ui
from specdec_core import metrics

ui.page_header("Keys")
ui.require_data()
filters = ui.filters()

head = ui.cached(metrics.headline, filters=filters)
st.caption(f"{head['unique_keys']:,} unique cache keys for {head['unique_identities']:,} unique request "
           "identities in this selection. A correct key gives each identity a key of its own.")
collisions = ui.cached(metrics.key_collisions, filters=filters)
if collisions.empty:
    st.success("No cache key was shared by different request identities in this selection.")
    st.stop()

st.subheader(f"{head['key_collisions']:,} keys shared by more than one identity")
table = st.dataframe(collisions, hide_index=True, on_select="rerun", selection_mode="single-row",
                     key="collision_table")
rows = [i for i in table.selection.rows if i < len(collisions)]
chosen = collisions.iloc[rows[0] if rows else 0]

st.subheader("Identities behind one key")
st.caption("Select a row above to see another key. Showing:")
st.code(f"deployment: {ui.deployment_label(chosen.deployment)}\ncache_key:  {chosen.cache_key}", language=None)
identities = ui.cached(metrics.key_collision_identities, chosen.deployment, chosen.cache_key, filters=filters)
st.dataframe(identities, hide_index=True)
