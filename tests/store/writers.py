"""Two writer processes and a reader process on one store at once: the file store's and the shared lake's tests."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import rec, write_jsonl

from specdec_core.ingestion import ingest
from specdec_core.store import Store

WRITER = """
import sys
from specdec_core.store import Store
from specdec_core.ingestion import ingest
r = ingest(Store(sys.argv[1]), [sys.argv[2]])
print(r.accepted)
"""


READER = """
import json, os, sys
from specdec_core.store import Store
from specdec_core.store.connection import release_snapshots
store, seen, errors = Store(sys.argv[1]), [], []
stop_file = sys.argv[2]
while True:
    stopping = os.path.exists(stop_file)  # one more read after the writers are done, then stop
    try:
        with store.read() as con:
            seen.append(con.execute(
                "SELECT (SELECT count(*) FROM requests), (SELECT sum(requests) FROM summary_minute), "
                "(SELECT count(*) FROM hit_sources), (SELECT count(*) FROM requests WHERE cache_hit)").fetchall()[0])
    except Exception as exc:
        errors.append(repr(exc))
    if len(seen) + len(errors) == 1:
        print("reading", flush=True)
    if stopping:
        break
print(json.dumps({"seen": [[int(v or 0) for v in row] for row in seen], "errors": errors}))
"""


def batch(prefix: str, n: int, minute: int) -> list[dict]:
    # Two writers' traffic on shared keys: a hit's source may be the other writer's miss.
    return [rec(f"{prefix}{i}", ts=f"2026-03-01T10:{minute + i // 600:02d}:{i // 10 % 60:02d}Z", cache_key=f"K{i % 50}",
                cache_hit=i % 3 != 0, draft_model=("d1", "d2")[(i // 7) % 2]) for i in range(n)]


def content(db) -> tuple:
    with Store(db).read() as con:
        return (con.execute("SELECT * EXCLUDE (ingest_id) FROM requests ORDER BY request_id").fetchall(),
                con.execute("SELECT * FROM hit_sources ORDER BY request_id").fetchall(),
                con.execute("SELECT * FROM summary_minute ORDER BY ALL").fetchall())


def two_writers_and_a_reader(db: str, tmp_path, rows: int, env: dict | None = None) -> set[int]:
    """Seed `db`, then two writer processes of `rows` rows each while a reader process reads in a loop: both
    writers land, every snapshot the reader saw is whole, and the store equals a DuckDB file fed the same
    logs one after the other. Returns the request counts the reader saw."""
    seed = write_jsonl(tmp_path / "seed.jsonl", batch("s", 200, 0))
    a = write_jsonl(tmp_path / "a.jsonl", batch("a", rows, 1))
    b = write_jsonl(tmp_path / "b.jsonl", batch("b", rows, 1))
    ingest(Store(db), [str(seed)])
    stop_file = tmp_path / "writers-done"
    reader = subprocess.Popen([sys.executable, "-c", READER, db, str(stop_file)], stdout=subprocess.PIPE, text=True,
                              env=env)
    assert reader.stdout.readline().strip() == "reading"  # the reader is reading before the writers start
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, db, str(f)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env) for f in (a, b)]
    outs = [w.communicate(timeout=300) for w in writers]
    assert [w.returncode for w in writers] == [0, 0], [err for _, err in outs]
    assert [int(out) for out, _ in outs] == [rows, rows]
    stop_file.touch()
    read = json.loads(reader.communicate(timeout=120)[0])
    assert read["errors"] == []
    counts = {row[0] for row in read["seen"]}
    assert counts <= {200, 200 + rows, 200 + 2 * rows} and 200 in counts and len(read["seen"]) > 20
    # No torn read: every snapshot's summaries and verdicts count the rows it holds.
    assert all(n == minute_total and verdicts == hits for n, minute_total, verdicts, hits in read["seen"])

    one_by_one = str(tmp_path / "sequential.duckdb")
    for f in (seed, a, b):
        ingest(Store(one_by_one), [str(f)])
    assert content(db) == content(one_by_one)
    return counts
