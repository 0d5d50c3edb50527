"""A lake's maintenance: a follow's many small files merged by tiers, the large ones left alone, the store
still equal to a DuckDB file. Apart from test_lake.py: these are the lake's three longest tests, and the
suite's workers take a module each."""

from __future__ import annotations

import hashlib

from helpers import contents, rec, write_jsonl

from specdec_core.derived import migrate
from specdec_core.ingestion import ingest
from specdec_core.store import Store


def _incompressible(b: int, i: int) -> str:
    """Text a merge can't shrink: merged files grow by each batch's size (repeated words shrank to a
    fraction, and filling a tier took three times the batches)."""
    return " ".join(hashlib.sha256(f"{b} {i} {k}".encode()).hexdigest()[:8] for k in range(10))


def test_small_batches_are_merged_into_few_files_and_the_lake_still_equals_a_file(tmp_path, monkeypatch):
    from specdec_core.store import lake as lakes

    monkeypatch.setattr(lakes, "MAINTAIN_ABOVE_FILES", 40)
    monkeypatch.setattr(lakes, "KEEP_REPLACED", "0 seconds")
    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 's.sqlite'}"
    # A follow's small batches: each adds files to every table it touches (8 a batch: never merged, the eighth
    # batch leaves 66, over the bound below).
    for b in range(8):
        batch = write_jsonl(tmp_path / f"b{b}.jsonl", [
            rec(f"b{b}-{i}", ts=f"2026-03-01T10:{b:02d}:{i:02d}Z", cache_key=f"K{i % 7}", cache_hit=i % 2 == 1,
                max_tokens=(16, 64)[(b + i) % 2], output_text=f"out {b} {i}" * 40) for i in range(300)])
        for name in (file_store, lake):
            ingest(Store(name), [str(batch)])
        with Store(lake).read() as con:
            assert lakes.live_files(con) <= 40 + 20, "merged once past the threshold"
    assert contents(lake) == contents(file_store)
    migrate(Store(lake))  # merges whatever the threshold left, and deletes what it replaced
    files = list((tmp_path / "s.sqlite.files").glob("**/*.parquet"))
    with Store(lake).read() as con:
        deletes = con.execute("SELECT count(*) FROM __ducklake_metadata_store.ducklake_delete_file "
                              "WHERE end_snapshot IS NULL").fetchall()[0][0]
        assert len(files) == lakes.live_files(con) + deletes < 40, "replaced files are deleted from the disk"
    assert contents(lake) == contents(file_store)


# Above the number of tables a batch writes to (each keeps at least one small file, so no merge gets the store
# below that), low enough that ten small batches cross it.
THRESHOLD = 24


def test_a_kept_writer_spreads_its_merges_over_its_writes_and_does_the_chores_in_turn(tmp_path, monkeypatch):
    """A follow's writes each merge the busiest tables' small files, not every table's at once (a 3 s pause)."""
    from specdec_core.store import lake as lakes

    monkeypatch.setattr(lakes, "MAINTAIN_ABOVE_FILES", THRESHOLD)
    monkeypatch.setattr(lakes, "CHORES_EVERY", 3)
    monkeypatch.setattr(lakes, "KEEP_REPLACED", "0 seconds")
    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 's.sqlite'}"
    calls, left_unmerged = [], []
    original = lakes.maintain

    def watched(con, full=False, spread=False, chores=True):
        original(con, full=full, spread=spread, chores=chores)
        small = lakes.live_files(con, below=lakes.MERGE_TIERS[0])
        calls.append((spread, chores, small))
        left_unmerged.append(bool(lakes._tables_by_small_files(con, lakes.MERGE_TIERS[0])))
        if chores:  # what the merges replaced is gone from the disk, not only from the catalog
            on_disk = len(list((tmp_path / "s.sqlite.files").glob("**/*.parquet")))
            deletes = con.execute("SELECT count(*) FROM __ducklake_metadata_store.ducklake_delete_file "
                                  "WHERE end_snapshot IS NULL").fetchall()[0][0]
            assert on_disk == lakes.live_files(con) + deletes

    monkeypatch.setattr(lakes, "maintain", watched)
    for b in range(10):  # maintained from the fourth batch on: seven times
        batch = write_jsonl(tmp_path / f"b{b}.jsonl", [
            rec(f"b{b}-{i}", ts=f"2026-03-01T10:{b:02d}:{i:02d}Z", cache_key=f"K{i % 7}", cache_hit=i % 2 == 1,
                max_tokens=(16, 64)[(b + i) % 2]) for i in range(40)])
        for name in (file_store, lake):
            ingest(Store(name), [str(batch)])
    assert len(calls) >= 6
    assert all(spread for spread, _, _ in calls), "the writer was kept: every maintenance spread"
    assert [chores for _, chores, _ in calls[:6]] == [False, False, True] * 2
    assert all(small <= THRESHOLD for _, _, small in calls), ("each brought the store back under it", calls)
    assert any(left_unmerged), "no maintenance merged every table's small files"
    assert contents(lake) == contents(file_store)


def test_a_writes_merges_leave_large_files_alone_and_merge_a_tier_once_it_holds_enough(tmp_path, monkeypatch):
    """A follow's maintenance merges its small files, not the store's large one into them each time."""
    from specdec_core.store import lake as lakes

    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 's.sqlite'}"
    catalog = "__ducklake_metadata_store"
    requests_files = (f"SELECT f.path, f.file_size_bytes FROM {catalog}.ducklake_data_file f JOIN {catalog}.ducklake_table t "
                      "USING (table_id) WHERE t.table_name = 'requests' AND f.end_snapshot IS NULL AND t.end_snapshot IS NULL")
    big = write_jsonl(tmp_path / "big.jsonl", [
        rec(f"big-{i}", ts=f"2026-03-01T09:{i // 60 % 60:02d}:{i % 60:02d}Z", cache_key=f"K{i % 11}",
            output_text=f"stored {i} " * 30) for i in range(3000)])
    for name in (file_store, lake):
        ingest(Store(name), [str(big)])
    with Store(lake).read() as con:
        ((big_path, big_size),) = con.execute(requests_files).fetchall()
    # Tiers scaled to this store: its large file is at the top; a batch's files are far below the first.
    tiers = (big_size // 8, big_size // 4, big_size)
    monkeypatch.setattr(lakes, "MERGE_TIERS", tiers)
    monkeypatch.setattr(lakes, "MERGE_AT", 3)
    # Merged often (a low threshold), each small merge lands in the middle tier; the third one merges it up.
    monkeypatch.setattr(lakes, "MAINTAIN_ABOVE_FILES", 12)
    monkeypatch.setattr(lakes, "KEEP_REPLACED", "0 seconds")
    counts, merged_up = [], set()
    for b in range(12):
        batch = write_jsonl(tmp_path / f"b{b}.jsonl", [
            rec(f"b{b}-{i}", ts=f"2026-03-01T10:{b:02d}:{i:02d}Z", cache_key=f"K{i % 7}", cache_hit=i % 2 == 1,
                output_text=_incompressible(b, i)) for i in range(40)])
        for name in (file_store, lake):
            ingest(Store(name), [str(batch)])
        with Store(lake).read() as con:
            files = dict(con.execute(requests_files).fetchall())
            assert files.get(big_path) == big_size, f"batch {b}: the large file was rewritten"
            assert lakes.live_files(con, below=tiers[0]) <= 12 + 20, "small files merged past the threshold"
            middle = [size for size in files.values() if tiers[0] <= size < tiers[1]]
            assert len(middle) < 3, f"batch {b}: a tier holding {len(middle)} files was not merged"
            merged_up |= {path for path, size in files.items() if size >= tiers[1] and path != big_path}
            counts.append(len(files))
    assert min(counts[5:]) < max(counts), "the small files were merged"
    assert merged_up, "the middle tier was merged up once it held three files"
    assert contents(lake) == contents(file_store)
