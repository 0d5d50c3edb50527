"""A log shaped like real services', for bench_formats.py's `services` case, and the same records without extras.

Real loggers (structlog, the stdlib's `extra=`) put fields the contract doesn't name wherever they go: before
the first known field, between known ones, last, and not the same ones on every line. Made from the
tie-heavy log (bench/tie_log.py: ties, RFC 3339 and epoch-millisecond timestamps mixed, exact duplicates,
hostile lines), its ten trailing unknown fields cut off (`clean`), then, per record (`services`):

- `service_version` just before `target_model`, on every record;
- `level` and `logger` first, on a quarter of the records;
- `host` and `pid` after `request_id`, on a third;
- `ctx` (a nested object, a list, text that looks like JSON) before `output_text`, on a fifth;
- `i` (the request's number) last, on half.

So the records hold 16 different sets of other fields in varying places, as a service's mixed log lines do.

    make_service_logs(folder, rows) -> (services folder, clean folder), FILES JSON Lines files each
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
from tie_log import FILES, make_tie_log

# Each record's line as written, from the clean line (no other fields) and n, its request's number (an exact
# duplicate line stays exact).
_SERVICES = r"""
CASE WHEN NOT starts_with(raw, '{"request_id":') THEN raw ELSE
  (CASE WHEN n % 4 = 0 THEN '{"level":"info","logger":"decode.' || (n % 3) || '",' ELSE '{' END)
  || ins(ins(ins(raw[2:length(raw) - 1],
        ',"ts":', CASE WHEN n % 3 = 0 THEN ',"host":"pod-' || (n % 17) || '","pid":' || (1000 + n % 89) ELSE '' END),
        ',"target_model":', ',"service_version":"4.2.' || (n % 7) || '"'),
        ',"output_text":', CASE WHEN n % 5 = 0 THEN ',"ctx":{"user":"u-' || (n % 9973)
            || '","tags":["ab-test","v' || (n % 5) || '"],"note":"{\"looks\": \"like json\"}","retries":'
            || (n % 3) || '}' ELSE '' END)
  || (CASE WHEN n % 2 = 0 THEN ',"i":' || n ELSE '' END) || '}'
END"""
# `text` put in before the first `needle` of `s`.
_INSERT_MACRO = ("CREATE OR REPLACE MACRO ins(s, needle, text) AS "
                 "CASE WHEN strpos(s, needle) > 0 THEN s[:strpos(s, needle) - 1] || text || s[strpos(s, needle):] "
                 "ELSE s END")


def make_service_logs(folder: Path, rows: int) -> tuple[Path, Path]:
    """Write `folder`/services and `folder`/clean (the same records, no other fields), FILES files each."""
    services, clean = folder / "services", folder / "clean"
    if all(len(list(p.glob("*.jsonl"))) == FILES for p in (services, clean)):
        return services, clean
    started = time.perf_counter()
    ties = make_tie_log(folder / "ties", rows)
    services.mkdir(parents=True, exist_ok=True)
    clean.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(_INSERT_MACRO)
        for part in sorted(ties.glob("*.jsonl")):
            # Lines as they are (one column, no quoting), in file order; the ten trailing fields cut off.
            con.execute(r"""
                CREATE OR REPLACE TABLE lines AS
                SELECT coalesce(try_cast(regexp_extract(raw, '"request_id":"[^"0-9]*([0-9]+)"', 1) AS BIGINT), 0)
                           AS n, row_number() OVER () AS line,
                       CASE WHEN strpos(raw, ',"trace_id":') > 0
                            THEN raw[:strpos(raw, ',"trace_id":') - 1] || '}' ELSE raw END AS raw
                FROM read_csv(?, columns = {'raw': 'VARCHAR'}, delim = chr(1), quote = '', escape = '',
                              header = false, auto_detect = false)
            """, [str(part)])
            for out, text in ((clean / part.name, "raw"), (services / part.name, _SERVICES)):
                rows_out = con.execute(f"SELECT {text} FROM lines ORDER BY line").fetchall()
                out.write_text("".join(r[0] + "\n" for r in rows_out), encoding="utf-8")
    finally:
        con.close()
    print(f"made the services log and its clean twin in {time.perf_counter() - started:.0f} s")
    return services, clean
