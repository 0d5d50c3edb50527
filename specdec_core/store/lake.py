"""Where a store lives and how DuckDB reaches it: a DuckLake catalog plus a folder (or S3 prefix) of Parquet files.

The local default needs no setup: `--db PATH` names a SQLite catalog at PATH, its data files in
`PATH.files/` beside it. A shared store (several machines ingesting and reading) puts the catalog in
PostgreSQL and the files on S3, named by the `[store]` table of specdec.toml or $SPECDEC_STORE:

    [store]
    catalog = "postgres:dbname=specdec host=db.internal user=triage"
    data_path = "s3://incident-logs/specdec/"
    s3_endpoint = "s3.eu-west-1.amazonaws.com"   # optional, with s3_region, s3_url_style, s3_use_ssl

S3 credentials come from $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY, never from the file.
Every extension is loaded from the wheel pip installed; nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

DEFAULT_DB = "data/specdec.duckdb"
STORE_ENV = "SPECDEC_STORE"
STORE_DATA_ENV = "SPECDEC_STORE_DATA"
ALIAS = "store"
_S3_KEYS = ("s3_endpoint", "s3_region", "s3_url_style", "s3_use_ssl")
_DUCKDB_VERSION = "v" + duckdb.__version__


class LakeError(RuntimeError):
    """The store's catalog or data path can't be used; the message is one line."""


@dataclass(frozen=True)
class Location:
    """A store's catalog (a SQLite file path, or `postgres:<libpq connection string>`) and data path."""

    catalog: str
    data_path: str
    s3: tuple[tuple[str, str], ...] = field(default=())

    @property
    def local(self) -> bool:
        return not self.catalog.startswith("postgres:")

    @property
    def attach_target(self) -> str:
        return self.catalog if not self.local else "sqlite:" + self.catalog


def local_location(path: str | os.PathLike[str]) -> Location:
    """The local layout for `path`, written through a symlink to its target (so the link stays a link)."""
    real = os.path.realpath(path)
    return Location(real, real + ".files" + os.sep)


def _config_table() -> dict:
    from specdec_core.config import tomllib
    from specdec_core.decoding.registry import default_config_path

    source = default_config_path()
    if not source.is_file():
        return {}
    try:
        table = tomllib.loads(source.read_text(encoding="utf-8")).get("store", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LakeError(f"{source}: cannot read the [store] table: {exc}") from None
    if not isinstance(table, dict):
        raise LakeError(f"{source}: [store] must be a table")
    return table


def configured_location() -> Location | None:
    """The shared store named by $SPECDEC_STORE (and $SPECDEC_STORE_DATA) or specdec.toml's [store]; else None."""
    table = _config_table()
    catalog = os.environ.get(STORE_ENV) or table.get("catalog")
    if not catalog:
        return None
    data_path = os.environ.get(STORE_DATA_ENV) or table.get("data_path")
    if not data_path:
        if catalog.startswith("postgres:"):
            raise LakeError("[store]: a PostgreSQL catalog needs data_path (or $SPECDEC_STORE_DATA), "
                            "e.g. s3://bucket/prefix/")
        return local_location(catalog)
    s3 = tuple((k, str(table[k])) for k in _S3_KEYS if k in table)
    if not catalog.startswith("postgres:"):
        catalog = os.path.realpath(catalog)
    return Location(catalog, data_path if data_path.endswith(("/", os.sep)) else data_path + "/", s3)


def _extension_file(module_name: str, name: str) -> Path:
    try:
        module = __import__(module_name)
    except ImportError:
        raise LakeError(f"the {module_name.replace('_', '-')} package is missing; reinstall with "
                        "`pip install -e .` (it ships the DuckDB extension the store needs)") from None
    found = Path(module.__file__).parent / "extensions" / _DUCKDB_VERSION / f"{name}.duckdb_extension"
    if not found.is_file():
        raise LakeError(f"{found}: no such extension for DuckDB {duckdb.__version__}; install "
                        f"{module_name.replace('_', '-')}=={duckdb.__version__}")
    return found


def _as_named(source: Path, name: str) -> Path:
    """`source` under the file name DuckDB derives the extension's entry point from.

    duckdb-extension-sqlite ships `sqlite.duckdb_extension`, whose entry point is sqlite_scanner's.
    """
    folder = Path(tempfile.gettempdir()) / f"specdec-extensions-{os.getuid()}-{_DUCKDB_VERSION}"
    folder.mkdir(mode=0o700, exist_ok=True)
    link = folder / f"{name}.duckdb_extension"
    if not (link.is_symlink() and os.readlink(link) == str(source)):
        tmp = folder / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(source)
        os.replace(tmp, link)
    return link


def _load_extensions(con: duckdb.DuckDBPyConnection, location: Location) -> None:
    con.execute(f"LOAD '{_extension_file('duckdb_extension_ducklake', 'ducklake')}'")
    if location.local:
        con.execute(f"LOAD '{_as_named(_extension_file('duckdb_extension_sqlite', 'sqlite'), 'sqlite_scanner')}'")
    else:
        con.execute(f"LOAD '{_extension_file('duckdb_extension_postgres', 'postgres')}'")
    if location.data_path.startswith("s3://"):
        con.execute(f"LOAD '{_extension_file('duckdb_extension_httpfs', 'httpfs')}'")
        _s3_secret(con, location)


def _s3_secret(con: duckdb.DuckDBPyConnection, location: Location) -> None:
    settings = dict(location.s3)
    parts = ["TYPE s3", "KEY_ID ?", "SECRET ?"]
    params: list[str] = [os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", "")]
    for key, option in (("s3_endpoint", "ENDPOINT"), ("s3_region", "REGION"), ("s3_url_style", "URL_STYLE")):
        if key in settings:
            parts.append(f"{option} '{_literal(settings[key])}'")
    if "s3_use_ssl" in settings:
        parts.append(f"USE_SSL {'true' if settings['s3_use_ssl'].lower() in ('1', 'true', 'yes') else 'false'}")
    # CREATE SECRET takes no parameters: the credentials are quoted into the statement, never logged.
    sql = "CREATE OR REPLACE SECRET specdec_s3 (" + ", ".join(parts) + ")"
    for value in params:
        sql = sql.replace("?", f"'{_literal(value)}'", 1)
    con.execute(sql)


def _literal(text: str) -> str:
    return text.replace("'", "''")


def _create_sqlite_catalog(path: str) -> None:
    """An empty SQLite file in WAL mode: readers then never block the writer's commit, nor it them."""
    import sqlite3

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=WAL")
    finally:
        db.close()


def open_lake(location: Location, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A fresh DuckDB instance with the store attached as `store` (created when missing, unless read_only)."""
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                              "autoload_known_extensions": False})
    try:
        if location.local and not read_only and not os.path.exists(location.catalog):
            _create_sqlite_catalog(location.catalog)
        _load_extensions(con, location)
        options = [f"DATA_PATH '{_literal(location.data_path)}'"]
        if read_only:
            options.append("READ_ONLY")
        con.execute(f"ATTACH 'ducklake:{_literal(location.attach_target)}' AS {ALIAS} ({', '.join(options)})")
    except BaseException:
        con.close()
        raise
    return con
