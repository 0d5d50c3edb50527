"""Appending to a store that holds 1M and 5M rows beside appending the same lines to an empty store.

Target (the appending-store issue): 3 lines, and 20,000 lines, into a 1M-row store (and a 5M-row one)
take at most 1.5x as long as into an empty store. Both kinds of store, in the same run: the DuckDB file
(each write works on a copy swapped in whole) and a DuckLake (SQLite catalog, Parquet files beside it;
a write is one transaction that adds files). The appended lines are live traffic of the same
services: the store's cache keys and identities, request ids it doesn't hold, ten fields we don't
know, duplicate timestamps and a few hostile lines. Each append runs in a fresh process on a copy of
the base store (copying is not timed); the figure is the ingest call's own time, median of three.

`--warm` times the append in a process that has ingested once already (a --follow, the dashboard): the
first ingest of a process also pays for imports (DuckDB's binding imports pandas, 0.17 s), which hides part
of what a store that holds rows costs more. A file store's write copies the file: `--work DIR` makes the
stores (and so the copies) in DIR, e.g. on a filesystem with reflinks (XFS, btrfs), where the copy shares
the file's blocks.

    .venv/bin/python bench/bench_append.py [--sizes 1000000,5000000] [--kinds file,lake] [--work DIR] [--warm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import HOSTILE, OUT, ROOT, UNKNOWN_FIELDS, run_child  # noqa: E402

APPEND = """
import sys, time
from specdec_core.store import Store
from specdec_core.ingestion import ingest
if len(sys.argv) > 3:  # --warm: a first ingest into a scratch store pays the imports, as a long-lived process has
    ingest(Store(sys.argv[3]), [sys.argv[1]])
t = time.perf_counter()
r = ingest(Store(sys.argv[2]), [sys.argv[1]])
print(f"{time.perf_counter() - t:.4f} {r.accepted} {r.quarantined}")
"""

START = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)


def base_store(rows: int, kind: str = "file") -> Path:
    """A store holding `rows` requests of eight hours of traffic, made once and kept in bench/out.

    A file store is the .duckdb file; a lake, a folder holding its catalog (s.sqlite) and files."""
    db = OUT / (f"append-base-{rows}.duckdb" if kind == "file" else f"append-base-{rows}.lake")
    if rows and not db.exists():
        from specdec_core.demo.synthetic import make_synthetic_log
        from specdec_core.ingestion import ingest
        from specdec_core.store import Store

        log = make_synthetic_log(OUT / f"append-base-{rows}.jsonl", rows, start=START)
        started = time.perf_counter()
        tmp = OUT / f"append-base.tmp.{kind}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.unlink(missing_ok=True)
        ingest(Store(str(tmp) if kind == "file" else f"ducklake:{tmp / 's.sqlite'}"), [str(log)])
        shutil.move(tmp, db)
        log.unlink()
        print(f"built the {rows:,}-row {kind} store in {time.perf_counter() - started:.0f} s")
    elif rows:
        # A base kept from an older version is brought up to date once, so no timed write pays for it.
        from specdec_core.derived import migrate
        from specdec_core.store import Store

        migrate(Store(store_name(db, kind)))
    return db


def store_name(path: Path, kind: str) -> str:
    return str(path) if kind == "file" else f"ducklake:{path / 's.sqlite'}"


def live_lines(rows: int) -> Path:
    """`rows` lines of the next minutes of the same traffic, as a real service logs them."""
    import duckdb

    from specdec_core.demo.synthetic import make_synthetic_log

    out = OUT / f"append-live-{rows}.jsonl"
    if out.exists():
        return out
    plain = make_synthetic_log(OUT / f"append-live-{rows}.plain.jsonl", max(rows, 10), seed=2,
                               start=datetime(2026, 11, 20, 16, 0, tzinfo=timezone.utc), hours=rows / 5000 / 3600)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"""COPY (SELECT * EXCLUDE (seq, request_id), 'live-' || request_id AS request_id, {UNKNOWN_FIELDS}
                    FROM (SELECT *, row_number() OVER () AS seq FROM read_json(?, format = 'newline_delimited'))
                    LIMIT {rows})
                    TO '{out}' (FORMAT JSON)""", [str(plain)])
    con.close()
    plain.unlink()
    if rows >= 1000:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write("\n".join(HOSTILE) + "\n")
    return out


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    for leftover in (path, Path(str(path) + ".lock"), Path(str(path) + ".wal")):
        leftover.unlink(missing_ok=True)


def time_append(base: Path, lines: Path, kind: str = "file", repeats: int = 3, folder: Path = OUT,
                warm: bool = False) -> float:
    work, scratch = folder / f"append-work.{kind}", folder / f"append-scratch.{kind}"
    seconds = []
    for _ in range(repeats):
        _remove(work)
        if base.exists():
            (shutil.copyfile if kind == "file" else shutil.copytree)(base, work)
        # The copy is setup: its writeback must not land in the timed append (it cost up to 2 s at 5M).
        os.sync()
        _remove(scratch)
        _, _, printed = run_child(APPEND, str(lines), store_name(work, kind),
                                  *([store_name(scratch, kind)] if warm else []))
        seconds.append(float(printed.split()[0]))
    _remove(work)
    _remove(scratch)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,5000000", help="store sizes in rows, comma-separated")
    parser.add_argument("--kinds", default="file,lake", help="kinds of store: file, lake, or both")
    parser.add_argument("--work", default=str(OUT), help="the folder the appended stores are made in")
    parser.add_argument("--warm", action="store_true", help="time the append in a process that ingested once")
    args = parser.parse_args()
    folder = Path(args.work)
    folder.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from specdec_core.store.working_copy import filesystem_type
    OUT.mkdir(exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    batches = {n: live_lines(n) for n in (3, 20_000)}
    bases = {(size, kind): base_store(size, kind) for size in sizes for kind in kinds}
    print(f"\nstores appended to in {folder} ({filesystem_type(folder)}), "
          f"{'in a process that ingested once (--warm)' if args.warm else 'each in a fresh process'}")
    print(f"{'store':>6}{'lines':>8}{'empty store':>14}" + "".join(f"{f'{s:,} rows':>16}{'ratio':>8}" for s in sizes))
    for kind in kinds:
        for n, lines in batches.items():
            empty = time_append(OUT / "append-none", lines, kind, folder=folder, warm=args.warm)
            row = f"{kind:>6}{n:>8,}{empty:>12.2f} s"
            for size in sizes:
                into = time_append(bases[(size, kind)], lines, kind, folder=folder, warm=args.warm)
                row += f"{into:>14.2f} s{into / empty:>7.2f}x"
            print(row)
    print("\ntarget: each ratio <= 1.5x (the append costs what it adds, not what the store holds)")


if __name__ == "__main__":
    main()
