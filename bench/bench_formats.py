"""Ingest of 1M records in each log shape beside DuckDB's bare read_json of the same file (the floor).

- contract records as our service writes them, and the same records carrying ten fields we don't know
  (mixed types, a nested object, a list, text that looks like JSON), as real services log them;
- OpenTelemetry GenAI spans (OTLP JSON lines, ten spans a line, hex ids, a non-request span each line)
  and LiteLLM payloads (a hit's model_parameters is {}), each made from the same requests;
- `ties`: an incident-shaped log with real traffic's ties (bench/tie_log.py): 300 requests per key per
  millisecond on the hottest keys, most hits on a few keys, a third of the hits contaminated, RFC 3339 and
  epoch-millisecond timestamps mixed, unknown fields, rows shuffled into four files;
- `services`: the tie-heavy log's records with other fields where real loggers put them (bench/service_log.py:
  first, between known ones, last, different ones from record to record), and `clean`, the same records
  without them: the first within 10% of the second;
- `incident` (only when named): the contract's records as issue 57 describes its held-out incident log, two
  unknown fields (`service_version` between known ones, `i` last) and `ts` mixed (RFC 3339 and epoch
  milliseconds): the `ingest-speed` check's 3.5x.

Every file also holds hostile lines (bad JSON, wrong types, a huge integer) and duplicate timestamps.
Targets: the contract log within 3x of its floor, with ten unknown fields within 3x,
the tie-heavy log within 3.5x, the services log within 3x (goal 2x) and within 1.1x of its clean twin; OTel
and LiteLLM: rows/s beside the contract's; peak memory under 2 GB everywhere. Each side runs in its own
process, so peak memory is that process's. `--repeat N` runs each log's sides N times in turn (floor, ours,
floor, ours, ...: a loaded machine's drift falls on both) and reports medians; `--before DIR` adds a third
side, our ingest from another checkout's `specdec_core` (`git archive REV specdec_core | tar -x -C DIR`).

    .venv/bin/python bench/bench_formats.py [--rows 1000000] [--repeat 1] [--before DIR]
        [--logs contract,unknown,otel,litellm,ties,services,clean,incident]   (all but incident by default)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import HOSTILE, OUT, ROOT, UNKNOWN_FIELDS  # noqa: E402
from service_log import make_service_logs  # noqa: E402
from tie_log import make_tie_log  # noqa: E402

FLOOR = """
import duckdb, sys
con = duckdb.connect(sys.argv[2])
con.execute("SET enable_progress_bar = false")
con.execute("CREATE TABLE t AS SELECT * FROM read_json(?, format = 'newline_delimited', ignore_errors = true)",
            [sys.argv[1]])
con.close()
"""

# Ours, timed by phase from the ingest's progress steps: reading and checking (what the floor's read_json
# stands for) apart from the rest (fingerprinting, writing, judging hits, summarising: work the floor has none of).
OURS = """
import sys, time
from specdec_core.store import Store
from specdec_core.ingestion import ingest
phases, last = {}, [time.perf_counter(), "opening"]
def progress(step, total, what):
    now = time.perf_counter()
    phases[last[1].split(" ")[0]] = phases.get(last[1].split(" ")[0], 0.0) + now - last[0]
    last[:] = [now, what]
r = ingest(Store(sys.argv[2]), [sys.argv[1]], log_format=sys.argv[3], progress=progress)
assert r.accepted + r.duplicates + r.quarantined + r.skipped == r.read, r
print(f"{r.accepted} {r.quarantined} {r.skipped}")
print(" ".join(f"{k}={v:.2f}" for k, v in phases.items()))
"""
READ_AND_CHECK = ("opening", "reading", "checking")

# OTLP JSON: attributes are {key, value: AnyValue}; intValue as a string, as protobuf's JSON writes it.
OTEL_SQL = """
COPY (
  WITH r AS (SELECT *, row_number() OVER () AS seq FROM read_json(?, format = 'newline_delimited')),
  spans AS (
    SELECT seq // 10 AS line, {
      'traceId': md5(request_id), 'spanId': left(md5(request_id || 's'), 16), 'name': 'chat ' || target_model,
      'kind': 3, 'startTimeUnixNano': (epoch_us(ts::TIMESTAMPTZ) * 1000)::VARCHAR,
      'endTimeUnixNano': ((epoch_us(ts::TIMESTAMPTZ) + (coalesce(latency_ms, 1) * 1000)::BIGINT) * 1000)::VARCHAR,
      'attributes': list_filter([
        {'key': 'gen_ai.operation.name', 'value': {'stringValue': 'chat'}},
        {'key': 'specdec.request_id', 'value': {'stringValue': request_id}},
        {'key': 'gen_ai.request.model', 'value': {'stringValue': target_model}},
        {'key': 'gen_ai.request.temperature', 'value': {'doubleValue': temperature}},
        {'key': 'gen_ai.request.max_tokens', 'value': {'intValue': max_tokens::VARCHAR}},
        CASE WHEN seed IS NOT NULL THEN {'key': 'gen_ai.request.seed', 'value': {'intValue': seed::VARCHAR}} END,
        {'key': 'gen_ai.usage.output_tokens', 'value': {'intValue': output_tokens::VARCHAR}},
        {'key': 'specdec.prompt', 'value': {'stringValue': prompt}},
        {'key': 'specdec.output_text', 'value': {'stringValue': output_text}},
        {'key': 'specdec.draft_model', 'value': {'stringValue': coalesce(draft_model, 'none')}},
        {'key': 'specdec.tokenizer_version', 'value': {'stringValue': tokenizer_version}},
        {'key': 'specdec.cache_key', 'value': {'stringValue': cache_key}},
        {'key': 'specdec.cache_hit', 'value': {'boolValue': cache_hit}},
        {'key': 'specdec.deployment', 'value': {'stringValue': deployment}}
      ], lambda a: a IS NOT NULL)
    } AS span FROM r
  )
  SELECT [{'resource': {'attributes': [{'key': 'service.name', 'value': {'stringValue': 'decode'}}]},
           'scopeSpans': [{'scope': {'name': 'bench'}, 'spans': list(span) || [{
               'traceId': md5(line::VARCHAR), 'spanId': left(md5(line::VARCHAR), 16), 'name': 'GET /healthz',
               'kind': 2, 'startTimeUnixNano': '0', 'endTimeUnixNano': '0',
               'attributes': [{'key': 'http.method', 'value': {'stringValue': 'GET'}}]}]}]}] AS resourceSpans
  FROM spans GROUP BY line ORDER BY line
) TO '{out}' (FORMAT JSON)
"""

LITELLM_SQL = """
COPY (
  SELECT request_id AS id, 'completion' AS call_type, epoch_us(ts::TIMESTAMPTZ) / 1e6 AS startTime,
         epoch_us(ts::TIMESTAMPTZ) / 1e6 + coalesce(latency_ms, 1) / 1e3 AS endTime,
         coalesce(latency_ms, 1) / 1e3 AS response_time, 'openai/' || target_model AS model,
         {'litellm_model_name': target_model, 'cache_key': cache_key} AS hidden_params,
         [{'role': 'user', 'content': prompt}] AS messages,
         CASE WHEN cache_hit THEN '{}'::JSON
              ELSE json_object('temperature', temperature, 'max_tokens', max_tokens) END AS model_parameters,
         CASE WHEN cache_hit THEN true END AS cache_hit, CASE WHEN cache_hit THEN cache_key END AS cache_key,
         output_tokens AS completion_tokens,
         {'requester_metadata': {'draft_model': draft_model, 'tokenizer_version': tokenizer_version,
                                 'deployment': deployment}} AS metadata,
         {'id': request_id, 'choices': [{'finish_reason': finish_reason,
                                         'message': {'role': 'assistant', 'content': output_text}}]} AS response,
         0.0 AS saved_cache_cost
  FROM read_json(?, format = 'newline_delimited')
) TO '{out}' (FORMAT JSON)
"""


SERVICES, CLEAN = "services (other fields anywhere)", "services' records, no other fields"
INCIDENT = "incident (issue 57's shape)"


def make_logs(rows: int, wanted: set[str]) -> dict[str, Path]:
    """The logs in `wanted`, made the first time: the four shapes of one log, the tie-heavy log and the
    services log with its clean twin (folders)."""
    base = OUT / f"formats-{rows}-contract.jsonl"
    logs = {"contract": base, "contract + 10 unknown fields": OUT / f"formats-{rows}-unknown.jsonl",
            "otel": OUT / f"formats-{rows}-otel.jsonl", "litellm": OUT / f"formats-{rows}-litellm.jsonl"}
    if not all(p.exists() for name, p in logs.items() if name in wanted):
        _make_shapes(rows, logs)
    if INCIDENT in wanted:
        if not base.exists():
            _make_shapes(rows, logs)
        logs[INCIDENT] = OUT / f"formats-{rows}-incident.jsonl"
        if not logs[INCIDENT].exists():
            _make_incident(base, rows, logs[INCIDENT])
    if "ties" in wanted:
        logs["ties"] = make_tie_log(OUT / f"formats-{rows}-ties", rows)
    if wanted & {SERVICES, CLEAN}:
        logs[SERVICES], logs[CLEAN] = make_service_logs(OUT / f"formats-{rows}-services", rows)
    return logs


def _make_incident(base: Path, rows: int, out: Path) -> None:
    """The contract log's `rows` records as issue 57 describes its held-out incident log: two fields the
    contract doesn't name (`service_version` between known ones, `i` last) and `ts` an RFC 3339 string on half
    the records, epoch milliseconds on the other half; the hostile lines after them."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    tmp = out.with_suffix(".part")
    con.execute(f"""COPY (SELECT request_id,
                        CASE WHEN seq % 2 = 0 THEN to_json(epoch_ms(ts::TIMESTAMP))
                             ELSE to_json(strftime(ts::TIMESTAMP, '%Y-%m-%dT%H:%M:%S.%gZ')) END AS ts,
                        prompt, '2.14.' || (seq % 7) AS service_version, * EXCLUDE (request_id, ts, prompt, seq),
                        seq - 1 AS i
                    FROM (SELECT *, row_number() OVER () AS seq FROM read_json(?, format = 'newline_delimited',
                                                                                ignore_errors = true))
                    WHERE seq <= {int(rows)})
                    TO '{tmp}' (FORMAT JSON)""", [str(base)])
    con.close()
    with open(tmp, "a", encoding="utf-8") as fh:
        fh.write("\n".join(HOSTILE) + "\n")
    tmp.rename(out)


def _make_shapes(rows: int, logs: dict[str, Path]) -> None:
    import duckdb

    from specdec_core.demo.synthetic import make_synthetic_log

    base = logs["contract"]
    started = time.perf_counter()
    make_synthetic_log(base, rows)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"""COPY (SELECT * EXCLUDE (seq), {UNKNOWN_FIELDS} FROM (
                    SELECT *, row_number() OVER () AS seq FROM read_json(?, format = 'newline_delimited')))
                    TO '{logs['contract + 10 unknown fields']}' (FORMAT JSON)""", [str(base)])
    con.execute(OTEL_SQL.replace("{out}", str(logs["otel"])), [str(base)])
    con.execute(LITELLM_SQL.replace("{out}", str(logs["litellm"])), [str(base)])
    con.close()
    for log in logs.values():  # hostile lines after the records, so read_json's schema comes from real ones
        with open(log, "a", encoding="utf-8") as fh:
            fh.write("\n".join(HOSTILE) + "\n")
    print(f"generated {rows:,} requests in four shapes in {time.perf_counter() - started:.0f} s")


def run_child(code: str, *args: str, cwd: Path = ROOT) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak MB, stdout) of `python -c code args...` in a fresh process; `cwd` first on its
    module path. CPU (user + system, all threads) says what the work cost where other work shares the cores."""
    OUT.mkdir(exist_ok=True)
    usage = OUT / "child.usage"
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "-o", str(usage), sys.executable, "-c", code, *args],
                          check=True, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.stderr.strip():
        print(done.stderr.strip(), file=sys.stderr)
    peak_kb, user, system = usage.read_text().split()[-3:]
    return wall, float(user) + float(system), int(peak_kb) / 1024, done.stdout.strip()


def warm(path: Path) -> None:
    for part in sorted(path.glob("*.jsonl")) if path.is_dir() else [path]:
        with open(part, "rb") as fh:
            while fh.read(1 << 24):
                pass


def print_phase_table(tables: dict[str, dict[str, object]]) -> None:
    """Each phase of our ingest in seconds and as a multiple of the floor's whole run, one column per log."""
    names = list(tables)
    rows = list(dict.fromkeys(k for t in tables.values() for k in t))
    print(f"\n{'phase':22}" + "".join(f"{n[:24]:>26}" for n in names))
    for row in rows:
        cells = []
        for n in names:
            value, floor_s = tables[n].get(row), tables[n]["floor (read_json)"]
            if isinstance(value, tuple):
                cells.append(f"{value[0]:>12.0f} / {value[1]:.0f}")
            elif value is None:
                cells.append("")
            else:
                cells.append(f"{value:>8.2f} s {value / floor_s:>6.2f}x")  # type: ignore[operator]
        print(f"{row:22}" + "".join(f"{c:>26}" for c in cells))


def _median_run(runs: list[tuple[float, float, float, str]]) -> tuple[float, float, float, str]:
    """Each figure's median over the runs; the output of the run whose wall time is the median."""
    walls = [r[0] for r in runs]
    middle = runs[walls.index(statistics.median_low(walls))]
    return (statistics.median(walls), statistics.median(r[1] for r in runs), max(r[2] for r in runs), middle[3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--logs", default="contract,unknown,otel,litellm,ties,services,clean",
                        help="which logs to run: contract, unknown (contract + 10 unknown fields), otel, litellm, "
                             "ties (the tie-heavy incident log), services (other fields anywhere), clean (the "
                             "services log's records without them), incident (issue 57's held-out shape: "
                             "contract records with two unknown fields and mixed ts types; not in the default)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side, in turn; medians reported")
    parser.add_argument("--before", type=Path, help="a folder holding another checkout's specdec_core: a third side")
    args = parser.parse_args()
    short = {"contract": "contract", "unknown": "contract + 10 unknown fields", "otel": "otel", "litellm": "litellm",
             "ties": "ties", "services": SERVICES, "clean": CLEAN, "incident": INCIDENT}
    wanted = {short[name.strip()] for name in args.logs.split(",")}
    sys.path.insert(0, str(ROOT))
    OUT.mkdir(exist_ok=True)
    logs = make_logs(args.rows, wanted)
    sides = {"floor": (FLOOR, ROOT), "ours": (OURS, ROOT)}
    if args.before:
        sides["before"] = (OURS, args.before.resolve())
    print(f"\n{'log':34}{'floor s':>9}{'ours s':>9}{'ratio':>8}{'CPU s':>14}{'rows/s':>11}{'peak MB':>9}"
          "  accepted/quarantined/skipped")
    results: dict[str, dict[str, tuple[float, float, float, str]]] = {}
    tables: dict[str, dict[str, object]] = {}
    for name, log in logs.items():
        if name not in wanted:
            continue
        fmt = {"otel": "otel", "litellm": "litellm"}.get(name, "contract")
        # A folder (the tie-heavy and services logs' shuffled files): the floor reads them all by a glob.
        floor_input = str(log / "*.jsonl") if log.is_dir() else str(log)
        runs: dict[str, list[tuple[float, float, float, str]]] = {side: [] for side in sides}
        for _ in range(args.repeat):
            for side, (code, cwd) in sides.items():
                db = OUT / f"formats-{side}.duckdb"
                db.unlink(missing_ok=True)
                warm(log)  # each side starts with the log in the page cache: the first would pay for the disk
                extra = () if side == "floor" else (fmt,)
                runs[side].append(run_child(code, floor_input if side == "floor" else str(log), str(db), *extra,
                                            cwd=cwd))
        results[name] = {side: _median_run(r) for side, r in runs.items()}
        (floor_s, floor_cpu, floor_mb, _), (ours_s, ours_cpu, ours_mb, out) = results[name]["floor"], results[name]["ours"]
        counts, phase_line = out.splitlines()
        phases = {k: float(v) for k, v in (item.split("=") for item in phase_line.split())}
        tables[name] = {"floor (read_json)": floor_s, **phases, "ours, whole ingest": ours_s,
                        "peak MB floor / ours": (floor_mb, ours_mb)}
        print(f"{name[:34]:34}{floor_s:>9.1f}{ours_s:>9.1f}{ours_s / floor_s:>7.2f}x{ours_cpu:>6.1f} / {floor_cpu:<5.1f}"
              f"{args.rows / ours_s:>11,.0f}{ours_mb:>9.0f}  {counts.replace(' ', '/')}")
        if "before" in results[name]:
            before_s, before_cpu, before_mb, _ = results[name]["before"]
            print(f"{'':34}before: {before_s:.1f} s ({before_s / floor_s:.2f}x), CPU {before_cpu:.1f} s, {before_mb:.0f} MB")
        if args.repeat > 1:
            print(f"{'':34}runs, wall s: " + "; ".join(f"{side} " + ", ".join(f"{r[0]:.1f}" for r in rs)
                                                         for side, rs in runs.items()))
        checked = sum(v for k, v in phases.items() if k in READ_AND_CHECK)
        print(f"{'':34}reading and checking {checked:.1f} s ({checked / floor_s:.2f}x the floor); the rest "
              f"{ours_s - checked:.1f} s ({(ours_s - checked) / floor_s:.2f}x): "
              + ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if k not in READ_AND_CHECK))
    print_phase_table(tables)
    for name, target in (("contract", 3.0), ("contract + 10 unknown fields", 3.0), ("ties", 3.5), (SERVICES, 3.0),
                         (INCIDENT, 3.5)):
        if name not in results:
            continue
        floor_s, ours_s = results[name]["floor"][0], results[name]["ours"][0]
        ratio = ours_s / floor_s
        print(f"{name}: {ratio:.2f}x the floor (target <= {target}x): {'met' if ratio <= target else 'NOT met'}")
    if SERVICES in results and CLEAN in results:
        for side in ("ours", "before"):
            if side in results[SERVICES]:
                (wall, cpu, *_), (clean_wall, clean_cpu, *_) = results[SERVICES][side], results[CLEAN][side]
                print(f"{side}: other fields anywhere {wall / clean_wall:.2f}x the same records without them "
                      f"(CPU {cpu / clean_cpu:.2f}x; target <= 1.1x): {'met' if wall / clean_wall <= 1.1 else 'NOT met'}")


if __name__ == "__main__":
    main()
