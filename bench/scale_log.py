"""A large incident log for bench_scale.py: the services log, repeated, over 50 deployments.

One copy is bench/service_log.py's log of `base` rows (ties, RFC 3339 and epoch-millisecond `ts` mixed, exact
duplicates, hostile lines, other fields anywhere), with each record's deployment cut in 17 (16 for `core`)
by its cache key: `edge-a-07`, `core-15`, 50 deployments in all, each key's rows in one of them. Copy `k`
names its requests `c<k>-...` and moves each key to the next deployment of its kind, so the copies are the
same incident at the same hours in other deployments: the rows per second grow with the copies (a 20M-row
log is eight hours at 700 requests/s), the contaminated window stays where it is, and each copy's hits
find their sources in their own copy (copies k and k+17 share deployments: their ties double).

    make_scale_log(folder, copies, base=1_000_000) -> list of files, 4 per copy (copy 0's first)
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
from service_log import make_service_logs
from tie_log import FILES

SLICES = {"core": 16}  # deployments per kind of key: 17 for edge-a and edge-b, 16 for core (50)

_LINE = r"""
CASE WHEN NOT starts_with(raw, '{') OR strpos(raw, '"deployment":"') = 0 THEN raw ELSE
  regexp_replace(replace(raw, '"request_id":"', '"request_id":"c{k}-'),
    '"deployment":"([a-z-]+)"',
    '"deployment":"\1-' || lpad(((abs(hash(regexp_extract(raw, '"cache_key":"([^"]*)"', 1))) + {k})
        % CASE regexp_extract(raw, '"deployment":"([a-z-]+)"', 1) WHEN 'core' THEN {core} ELSE 17 END)::VARCHAR,
        2, '0') || '"')
END"""


def make_scale_log(folder: Path, copies: int, base: int = 1_000_000) -> list[Path]:
    """Write (or reuse) `copies` copies of the base log in `folder`; the files, copy by copy."""
    folder.mkdir(parents=True, exist_ok=True)
    services, _ = make_service_logs(folder / f"services-{base}", base)
    parts = sorted(services.glob("*.jsonl"))
    assert len(parts) == FILES, parts
    files = []
    started = time.perf_counter()
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        for k in range(copies):
            for part in parts:
                out = folder / f"copy-{k:02d}-{part.name}"
                files.append(out)
                if out.exists():
                    continue
                tmp = out.with_suffix(".tmp")
                query = _LINE.replace("{k}", str(k)).replace("{core}", str(SLICES["core"]))
                cur = con.execute(f"SELECT {query} FROM read_csv(?, columns = {{'raw': 'VARCHAR'}}, delim = chr(1), "
                                  "quote = '', escape = '', header = false, auto_detect = false)", [str(part)])
                with open(tmp, "w", encoding="utf-8") as fh:
                    while chunk := cur.fetchmany(50_000):
                        fh.write("".join(row[0] + "\n" for row in chunk))
                tmp.rename(out)
    finally:
        con.close()
    took = time.perf_counter() - started
    if took > 1:
        print(f"wrote {copies} copies of the {base:,}-row services log in {took:.0f} s")
    return files
