"""An ingest into a store that holds rows updates hit_sources and the summaries for what its batch touched
only; after every batch they must equal a full rebuild (judge_hits + build_summaries) of the same rows.

The batches are random files cut from one hard log (timestamp ties, keys shared across deployments,
identities that recur), so a later file holds earlier misses and earlier first sights; LiteLLM-style
rows add misses without a cache key whose hits arrive in another file naming them (backfill and late
source links).
"""

from __future__ import annotations

import random
import shutil

import duckdb
import pandas as pd
import pytest
from helpers import DROP, rec, write_jsonl
from random_logs import random_log, spell_ts

from specdec_core.derived import incremental, summaries, verdicts
from specdec_core.derived.hit_sources import judge_hits, last_miss_sql
from specdec_core.derived.summaries import build_summaries
from specdec_core.ingestion.load import ingest
from specdec_core.ingestion.relations import BatchRelations
from specdec_core.store.connection import Store, release_snapshots
from specdec_core.store.schema import FIRST_VERDICTS_DDL

# Each derived table as rows whose order and numbering don't matter: key_id and fp_id are checked apart.
_TABLES = {
    "hit_sources": "SELECT * FROM hit_sources",
    "summary_minute": "SELECT * FROM summary_minute",
    "summary_keys": "SELECT * EXCLUDE (key_id, fp_id) FROM summary_keys",
    "summary_shared_keys": "SELECT * EXCLUDE (key_id, fp_id) FROM summary_shared_keys",
    "summary_lengths": "SELECT * FROM summary_lengths",
    "summary_latency": "SELECT * FROM summary_latency",
    "summary_contaminated": "SELECT * FROM summary_contaminated",
    "summary_audience": "SELECT * FROM summary_audience",
    "summary_impact_hits": "SELECT * FROM summary_impact_hits",
    "summary_violations": "SELECT * FROM summary_violations",
    "identity_first_seen": "SELECT * FROM identity_first_seen",
    "identity_aliases": "SELECT * EXCLUDE (key_id, fp_id, alias_fp_id) FROM identity_aliases",
    # Appended per batch: one latest miss per key once folded.
    "key_last_miss": last_miss_sql("SELECT * FROM key_last_miss"),
    "summary_request_keys": "SELECT * FROM summary_request_keys",
    "summary_request_outputs": "SELECT * FROM summary_request_outputs",
    # Appended per batch: equal once summed.
    "summary_outputs": "SELECT * EXCLUDE (requests, hits), sum(requests)::BIGINT, sum(hits)::BIGINT "
                       "FROM summary_outputs GROUP BY ALL",
    # Each batch appends its first verdicts' counts; a rebuild counts the whole record again: equal once summed.
    "summary_first_verdicts": "SELECT * EXCLUDE (hits), sum(hits)::BIGINT FROM summary_first_verdicts GROUP BY ALL",
}


def _linked_rows(rng: random.Random, n: int) -> list[dict]:
    """Misses that logged no cache key, and hits that name them as their source (as LiteLLM logs them)."""
    rows = []
    for i in range(n):
        miss_at = rng.randrange(0, 60_000, 250)
        rows.append(rec(f"lm{i}", ts=spell_ts(miss_at, rng), cache_key=DROP, __unknown__=["cache_key"],
                        draft_model=rng.choice(["d1", "d2"])))
        for j in range(rng.randrange(0, 3)):
            # Some log no sampling parameters (LiteLLM's hits): partial identities, some another's alias.
            unknown = rng.choice([[], ["seed", "temperature", "top_p"], ["temperature"]])
            rows.append(rec(f"lh{i}-{j}", ts=spell_ts(miss_at + rng.randrange(0, 5_000, 250), rng),
                            cache_key=f"L{i % 4}", cache_hit=True, __source_request_id__=f"lm{i}",
                            draft_model=rng.choice(["d1", "d2"]), **{f: DROP for f in unknown},
                            **({"__unknown__": unknown} if unknown else {})))
    return rows


def _derived(con: duckdb.DuckDBPyConnection) -> dict[str, pd.DataFrame]:
    con.execute("SET TimeZone = 'UTC'")
    out = {}
    for name, sql in _TABLES.items():  # sorted by DuckDB: pandas' sort of every column took a fifth of the module
        out[name] = con.execute(f"SELECT * FROM ({sql}) ORDER BY ALL NULLS FIRST").df()
    for ids, of in (("key_id", "deployment, cache_key"), ("fp_id", "fingerprint")):
        # A number names one key (identity) and each key (identity) has one number.
        assert con.execute(f"SELECT count(DISTINCT {ids}) = count(DISTINCT ({of})) FROM summary_keys").fetchall() == [
            (True,)]
        assert con.execute(f"SELECT count(*) FROM (SELECT {of} FROM summary_keys GROUP BY ALL "
                           f"HAVING count(DISTINCT {ids}) > 1)").fetchall() == [(0,)]
    # An alias's number is its identity's number in the key.
    assert con.execute("SELECT count(*) FROM identity_aliases a ANTI JOIN summary_keys c "
                       "ON c.key_id = a.key_id AND c.fp_id = a.alias_fp_id AND c.fingerprint = a.alias").fetchall() == [
        (0,)]
    return out


def _assert_equals_full_rebuild(db, tmp_path) -> None:
    _assert_equal_to_a_full_rebuild([db], tmp_path)


def _assert_equal_to_a_full_rebuild(dbs, tmp_path) -> None:
    """Each store's derived tables equal a full rebuild of its rows; stores that hold the same rows (fed the same
    batches, updated each in its own way) are compared with one rebuild, their rows first checked equal."""
    release_snapshots()
    rebuilt = tmp_path / "rebuilt.duckdb"
    shutil.copyfile(dbs[0], rebuilt)
    updated, rows = [], []
    for db in dbs:
        with duckdb.connect(str(db), read_only=True) as con:
            updated.append(_derived(con))
            rows.append(con.execute("SELECT * FROM requests ORDER BY request_id").fetchall())
            # Every hit judged contaminated now was recorded when first judged so (the monitoring counter's record).
            assert con.execute("SELECT count(*) FROM summary_contaminated WHERE request_id NOT IN "
                               "(SELECT request_id FROM contaminated_first_verdicts)").fetchall() == [(0,)]
    assert all(held == rows[0] for held in rows[1:]), "the stores hold the same rows"
    with duckdb.connect(str(rebuilt)) as con:
        judge_hits(con)
        build_summaries(con)
        full = _derived(con)
    for db, tables in zip(dbs, updated, strict=True):
        for name in _TABLES:
            assert len(tables[name]) == len(full[name]), (db.name, name)
            pd.testing.assert_frame_equal(tables[name], full[name], check_exact=False, rtol=1e-9,
                                          obj=f"{db.name}: {name}")


# The judging reads a window of recent rows first (incremental.JUDGE_WINDOW_SECONDS) and the whole history
# only for the hits that window leaves unsettled: no window, windows of seconds (the log spans a minute) and
# the default all give the rebuild. Each seed's batches go into a store per window, all compared with one
# rebuild of the same rows after each batch (the rebuild knows no window).
@pytest.mark.parametrize(("seed", "windows"), [(1, (3600, 0)), (2, (3600, 1)), (3, (3600, 5))])
def test_each_batch_leaves_the_derived_tables_equal_to_a_full_rebuild(tmp_path, monkeypatch, seed, windows):
    rng = random.Random(seed)
    records = random_log(seed, n=300) + _linked_rows(rng, 12)
    for r in records:  # who received each output and its arm, some of them unlogged
        r["consumer"], r["experiment"] = rng.choice(["t1", "t2", None]), rng.choice(["arm-a", "arm-b", None])
    rng.shuffle(records)
    cuts = sorted(rng.sample(range(1, len(records)), 4))
    files = [write_jsonl(tmp_path / f"part{i}.jsonl", records[a:b])
             for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(records)], strict=True))]
    dbs = {window: tmp_path / f"store-{window}.duckdb" for window in windows}
    contaminated: dict[int, list[int]] = {window: [] for window in windows}

    def ingest_with(window: int, f):
        monkeypatch.setattr(incremental, "JUDGE_WINDOW_SECONDS", window)
        return ingest(Store(dbs[window]), [str(f)])

    for f in files:
        for window in windows:
            assert ingest_with(window, f).quarantined == 0
        _assert_equal_to_a_full_rebuild(list(dbs.values()), tmp_path)
        for window, db in dbs.items():
            with duckdb.connect(str(db), read_only=True) as con:
                contaminated[window].append(
                    con.execute("SELECT count(*) FROM hit_sources WHERE contaminated").fetchall()[0][0])
                backfilled = con.execute("SELECT count(*) FROM requests WHERE request_id LIKE 'lm%' "
                                         "AND cache_key IS NOT NULL").fetchall()[0][0]
    assert backfilled > 0
    for window in windows:
        assert contaminated[window][-1] > 20 and len(set(contaminated[window])) > 2, window  # verdicts moved
        # The same file again changes nothing.
        assert ingest_with(window, files[0]).accepted == 0
    _assert_equal_to_a_full_rebuild(list(dbs.values()), tmp_path)


def test_live_batches_into_a_busy_minute_add_their_counts_to_its_rows(tmp_path, monkeypatch):
    # Live traffic: each batch is later than every stored row and rejudges none of them, so its minutes add the
    # batch's counts to the rows they hold (same minute, same dimensions) instead of being counted again; and
    # its hits are judged from each key's latest miss (key_last_miss), reading no stored misses.
    judged, stored_misses = [], []
    judge, stored = incremental._judge, incremental._stored_misses
    monkeypatch.setattr(incremental, "_judge", lambda hits, first, misses: judged.append(hits) or judge(
        hits, first, misses))
    monkeypatch.setattr(incremental, "_stored_misses", lambda since: stored_misses.append(since) or stored(since))
    db = tmp_path / "store.duckdb"
    rng = random.Random(7)
    for b in range(4):
        rows = []
        for i in range(60):
            second = b * 12 + i // 5
            key = f"K{b}-{i % 3}"
            rows.append(rec(f"b{b}-{i}", ts=f"2026-03-01T10:00:{second:02d}.{i % 5}00Z", cache_key=key,
                            cache_hit=i % 6 >= 3, temperature=rng.choice([0.0, 0.7]), max_tokens=rng.choice([16, 64]),
                            output_tokens=rng.choice([10, 20, 80]), draft_tokens=rng.choice([0, 8, 12]),
                            accepted_tokens=rng.choice([0, 3]), latency_ms=rng.choice([5.0, 50.0]),
                            draft_model=rng.choice(["d1", "d2"]), seed=rng.choice([1, 2, None])))
        ingest(Store(db), [str(write_jsonl(tmp_path / f"b{b}.jsonl", rows))])
        _assert_equals_full_rebuild(db, tmp_path)
    # The three batches into a store with rows: judged from the latest misses, no window, no history.
    assert judged == ["fast", "fast", "fast"] and stored_misses == []
    with duckdb.connect(str(db), read_only=True) as con:
        # One row per minute and dimensions, holding all four batches.
        assert con.execute("SELECT count(*) = count(DISTINCT (minute, deployment, target_model, draft_model, "
                           "temperature, cache_hit)), sum(requests) FROM summary_minute").fetchall() == [(True, 240)]
        assert con.execute("SELECT sum(contaminated) > 0 FROM summary_minute").fetchall() == [(True,)]


def test_a_late_miss_changes_the_source_of_a_hit_stored_long_before(tmp_path):
    db = tmp_path / "store.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "a.jsonl", [
        rec("m1", ts="2026-03-01T10:00:00Z", cache_key="K", draft_model="d1"),
        rec("h1", ts="2026-03-01T10:05:00Z", cache_key="K", cache_hit=True, draft_model="d1"),
    ]))])
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT source_request_id, contaminated FROM hit_sources").fetchall() == [("m1", False)]
    release_snapshots()
    # A file that arrives late: a miss of another identity between the two.
    ingest(Store(db), [str(write_jsonl(tmp_path / "b.jsonl", [
        rec("m2", ts="2026-03-01T10:02:00Z", cache_key="K", draft_model="d2"),
    ]))])
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT source_request_id, contaminated, differing_fields FROM hit_sources"
                           ).fetchall() == [("m2", True, "draft_model")]
        assert con.execute("SELECT sum(contaminated) FROM summary_minute").fetchall() == [(1,)]
    _assert_equals_full_rebuild(db, tmp_path)


def test_the_order_files_arrive_in_does_not_change_the_store(tmp_path):
    # A hit naming its source may arrive before the miss or after it; either way the miss gets the hit's key.
    rng = random.Random(4)
    records = random_log(4, n=200) + _linked_rows(rng, 12)
    rng.shuffle(records)
    files = [write_jsonl(tmp_path / f"part{i}.jsonl", records[i::3]) for i in range(3)]
    stores = []
    for name, order in (("forward", files), ("backward", files[::-1])):
        db = tmp_path / f"{name}.duckdb"
        for f in order:
            ingest(Store(db), [str(f)])
        with duckdb.connect(str(db), read_only=True) as con:
            stores.append((
                con.execute("SELECT request_id, cache_key FROM requests ORDER BY ALL").fetchall(),
                con.execute("SELECT request_id, source_request_id, contaminated, differing_fields, first_sight "
                            "FROM hit_sources ORDER BY ALL").fetchall()))
    assert stores[0] == stores[1]
    assert sum(1 for rid, key in stores[0][0] if rid.startswith("lm") and key is not None) > 3


def test_the_outputs_summary_is_folded_once_it_has_doubled(tmp_path, monkeypatch):
    """Batches append their output groups; without folding, a long --follow would grow the table like requests."""
    monkeypatch.setattr(summaries, "OUTPUTS_SLACK", 0)
    db = tmp_path / "store.duckdb"
    sizes = []
    for batch in range(6):
        # The same ten outputs every batch (hits on them, as a cache serves them), and two new ones.
        rows = [rec(f"b{batch}-{i}", ts=f"2026-03-01T10:{batch:02d}:{i:02d}Z", cache_key=f"K{i}",
                    output_text=f"out {i}", cache_hit=batch > 0 and i < 10) for i in range(10)]
        rows += [rec(f"b{batch}-new{i}", ts=f"2026-03-01T10:{batch:02d}:3{i}Z", cache_key=f"N{batch}-{i}",
                     output_text=f"new {batch}-{i}", max_tokens=5 + i) for i in range(2)]
        ingest(Store(db), [str(write_jsonl(tmp_path / f"b{batch}.jsonl", rows))])
        release_snapshots()
        with duckdb.connect(str(db), read_only=True) as con:
            rows_now, groups = con.execute("SELECT count(*), count(DISTINCT (out_hash, fingerprint, deployment)) "
                                           "FROM summary_outputs").fetchall()[0]
            folded = int(con.execute("SELECT value FROM meta WHERE key = 'outputs_compacted'").fetchall()[0][0])
        assert rows_now <= 2 * folded  # folded whenever it passed twice its folded size
        sizes.append((rows_now, groups))
        _assert_equals_full_rebuild(db, tmp_path)
    assert any(rows_now == groups for rows_now, groups in sizes[1:])  # a fold happened after the first batch
    assert sizes[-1][1] == 10 + 2 * 6


def test_the_first_verdict_counts_are_folded_once_they_have_doubled(tmp_path, monkeypatch):
    """Batches append their first verdicts' counts; a long --follow must not grow the table with every batch."""
    monkeypatch.setattr(verdicts, "FOLD_SLACK", 0)
    db = tmp_path / "store.duckdb"
    sizes = []
    for batch in range(6):
        # Each batch: a miss and a hit of another identity on a fresh key, in the same two deployments.
        rows = [rec(f"b{batch}-{d}-{kind}", ts=f"2026-03-01T10:{batch:02d}:{n}0Z", deployment=d,
                    cache_key=f"K{batch}", prompt=f"{kind} {batch}", cache_hit=kind == "hit")
                for d in ("a", "b") for n, kind in enumerate(("miss", "hit"))]
        ingest(Store(db), [str(write_jsonl(tmp_path / f"b{batch}.jsonl", rows))])
        release_snapshots()
        with duckdb.connect(str(db), read_only=True) as con:
            sizes.append(con.execute(verdicts.ROWS_AND_COMBINATIONS_SQL).fetchall()[0])
            hits = con.execute("SELECT sum(hits) FROM summary_first_verdicts").fetchall()[0][0]
        assert hits == 2 * (batch + 1)
        _assert_equals_full_rebuild(db, tmp_path)
    assert all(rows <= 2 * combinations for rows, combinations in sizes)
    assert sizes[0] == (2, 2) and (4, 2) in sizes and any(rows == 2 for rows, _ in sizes[2:])


def test_a_keyed_first_verdict_record_of_an_older_store_loses_its_key_and_keeps_its_rows(tmp_path):
    """The record had a PRIMARY KEY (an index every first verdict paid for); a store written then is rebuilt
    without it by its next write, its verdicts kept, and the next batch's added."""
    db = tmp_path / "store.duckdb"

    def batch(n: int) -> str:
        rows = [rec(f"b{n}-{kind}", ts=f"2026-03-01T10:0{n}:{i}0Z", cache_key=f"K{n}", prompt=f"{kind} {n}",
                    cache_hit=kind == "hit") for i, kind in enumerate(("miss", "hit"))]
        return str(write_jsonl(tmp_path / f"b{n}.jsonl", rows))

    ingest(Store(db), [batch(0)])
    release_snapshots()
    with duckdb.connect(str(db)) as con:  # as a store of that version holds it
        con.execute("CREATE TABLE kept AS SELECT * FROM contaminated_first_verdicts; "
                    "DROP TABLE contaminated_first_verdicts")
        con.execute(FIRST_VERDICTS_DDL.replace("request_id VARCHAR NOT NULL", "request_id VARCHAR PRIMARY KEY"))
        con.execute("INSERT INTO contaminated_first_verdicts SELECT * FROM kept; DROP TABLE kept")
        keys = "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'contaminated_first_verdicts' " \
               "AND constraint_type = 'PRIMARY KEY'"
        assert con.execute(keys).fetchall() == [(1,)]
    ingest(Store(db), [batch(1)])
    release_snapshots()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(keys).fetchall() == [(0,)]
        assert con.execute("SELECT request_id, ingest_id FROM contaminated_first_verdicts ORDER BY 1").fetchall() \
            == [("b0-hit", 1), ("b1-hit", 2)]


@pytest.mark.parametrize("form", ["file", "lake"])
def test_an_update_drops_the_temp_tables_it_made(tmp_path, form):
    """A kept writer (a follow's) serves write after write: what one update made is gone before it commits, and
    the batch's own relations are those BatchRelations names, which the ingest drops next."""
    db = str(tmp_path / "store.duckdb") if form == "file" else f"ducklake:{tmp_path / 'store.sqlite'}"
    records = random_log(4, n=160)
    ingest(Store(db), [str(write_jsonl(tmp_path / "a.jsonl", records[:80]))])
    at_commit, first_verdicts = [], []

    def before_commit(con, ingest_id):
        at_commit.extend(name for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall())
        first_verdicts.append(con.execute("SELECT count(*) FROM contaminated_first_verdicts").fetchall()[0][0])

    ingest(Store(db), [str(write_jsonl(tmp_path / "b.jsonl", records[80:]))], before_commit=before_commit)
    assert first_verdicts[0] > 0, "the batch recorded first verdicts: their temp table was made"
    assert set(at_commit) <= set(BatchRelations().tables()), set(at_commit) - set(BatchRelations().tables())
