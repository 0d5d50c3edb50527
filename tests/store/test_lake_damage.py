"""A lake whose data file was deleted or overwritten: every command says so in one line naming the file, and
`migrate` checks the files before it says "up to date". A lake path DuckDB can't write, or a catalog that
fails half made, is one line and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import rec, write_jsonl

from specdec_core.cli import main as cli_main
from specdec_core.ingestion.load import ingest
from specdec_core.store import lake as lakes
from specdec_core.store.connection import Store


@pytest.fixture(scope="module")
def lake_copy(tmp_path_factory):
    """A lake of 2,000 requests (enough that its requests are a Parquet file, not inlined in the catalog)."""
    folder = tmp_path_factory.mktemp("lake")
    log = write_jsonl(folder / "log.jsonl", [rec(f"x{i}", cache_hit=i % 3 == 0) for i in range(2000)])
    ingest(Store(f"ducklake:{folder / 'cat.sqlite'}"), [str(log)])
    lakes.forget_writers()
    return folder


@pytest.mark.parametrize("damage", ["deleted", "overwritten"])
def test_a_damaged_lake_is_one_line_naming_the_file_from_every_command(lake_copy, tmp_path, capsys, damage):
    import shutil

    folder = tmp_path / "lake"
    shutil.copytree(lake_copy, folder)
    [data] = sorted((folder / "cat.sqlite.files" / "main" / "requests").glob("*.parquet"))
    if damage == "deleted":
        data.unlink()
    else:
        data.write_bytes(b"garbage")
    db = f"ducklake:{folder / 'cat.sqlite'}"
    more = write_jsonl(tmp_path / "more.jsonl", [rec("new")])
    for argv in (["stats"], ["report", "--out", str(tmp_path / "r.csv")], ["replay", "--request-id", "x1"],
                 ["migrate"], ["ingest", str(more)]):
        lakes.forget_readers()
        lakes.forget_writers()
        code = cli_main([*argv, "--db", db])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and str(data) in err and "damaged" in err, (argv, err)
    assert not (tmp_path / "r.csv").exists()


def test_a_lake_path_with_a_backslash_is_refused_in_one_line_and_leaves_nothing(tmp_path, capsys):
    folder = tmp_path / "a\\b"
    folder.mkdir()
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    code = cli_main(["ingest", str(log), "--db", f"ducklake:{folder / 'cat.sqlite'}"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "backslash" in err, err
    assert list(folder.iterdir()) == []


def test_a_catalog_that_fails_half_made_leaves_no_new_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("SPECDEC_STORE_DATA", str(tmp_path / "a-file" / "data"))  # can't be made
    folder = tmp_path / "lake"
    folder.mkdir()
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    code = cli_main(["ingest", str(log), "--db", f"ducklake:{folder / 'cat.sqlite'}"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "cannot create the store" in err, err
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".lock")] == []
    assert not any(Path(p).name.endswith(".new") for p in folder.iterdir())
