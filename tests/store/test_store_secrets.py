"""A PostgreSQL catalog's password in a store's name (`ducklake:postgres:... password=...`) is never printed:
every message that names the store, and the database's own errors quoted in them, show it as ***."""

from __future__ import annotations

import pytest
from helpers import free_port, rec, write_jsonl

from specdec_core.cli import main as cli_main
from specdec_core.ingestion import ingest
from specdec_core.store import Store, StoreError
from specdec_core.store.location import mask_secrets

SECRET = "S3cr3t-pw"


def catalogs(port: int) -> dict[str, str]:
    """The ways a libpq connection string can hold a password, each at a port where nothing listens."""
    return {
        "keyword": f"ducklake:postgres:dbname=triage user=u password={SECRET} host=127.0.0.1 port={port}",
        "keyword last": f"ducklake:postgres:dbname=triage host=127.0.0.1 port={port} password={SECRET}",
        "quoted": f"ducklake:postgres:dbname=triage password='{SECRET} x\\'y' host=127.0.0.1 port={port}",
        "uri": f"ducklake:postgres:postgresql://u:{SECRET}@127.0.0.1:{port}/triage",
        "uri query": f"ducklake:postgres:postgresql://u@127.0.0.1:{port}/triage?password={SECRET}",
    }


@pytest.mark.parametrize("form", list(catalogs(0)))
def test_no_command_prints_the_catalogs_password(tmp_path, capsys, form):
    db = catalogs(free_port())[form]
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    local = tmp_path / "local.duckdb"
    ingest(Store(local), [str(log)])
    runs = [["stats", "--db", db], ["migrate", "--db", db], ["ingest", str(log), "--db", db],
            ["report", "--db", db, "--out", str(tmp_path / "r.csv")], ["metrics", "serve", "--db", db],
            ["migrate", "--db", str(local), "--to", db]]
    for argv in runs:
        code = cli_main(argv)
        out, err = capsys.readouterr()
        assert code == 1, (argv, out, err)
        assert SECRET not in out + err and "S3cr3t" not in out + err, (argv, err)
        assert "***" in err and err.count("\n") == 1, (argv, err)


def test_the_store_names_itself_without_its_password():
    store = Store(catalogs(5432)["keyword"])
    assert SECRET not in str(store) and SECRET not in repr(store) and "password=***" in str(store)
    assert SECRET in store.name  # what connects keeps it
    with pytest.raises(StoreError) as err:
        Store("ducklake:")
    assert "ducklake:" in str(err.value)


def test_mask_secrets_leaves_text_without_a_password_as_it_was():
    text = "ducklake:postgres:dbname=triage host=db.internal user=triage: cannot open"
    assert mask_secrets(text) == text
    assert mask_secrets("postgres://u:pw@h/db, password = 'a b' and ?password=x&y=1") == (
        "postgres://u:***@h/db, password = *** and ?password=***&y=1")
