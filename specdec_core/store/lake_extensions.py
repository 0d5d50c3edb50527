"""A DuckDB instance for a lake: the extensions it needs, LOADed from the wheels pip installed (nothing is
downloaded at run time), and the S3 secret when the data files are on S3."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import duckdb

from specdec_core.extras import MissingExtra, require
from specdec_core.store.errors import LakeError
from specdec_core.store.instance import instance_config
from specdec_core.store.location import LakeLocation
from specdec_core.store.sql import literal

_DUCKDB_VERSION = "v" + duckdb.__version__


def _extension_file(package: str, name: str) -> Path:
    try:
        module = require("lake", package.replace("-", "_"))
    except MissingExtra as exc:
        raise LakeError(f"a DuckLake store {exc}") from None
    found = Path(module.__file__).parent / "extensions" / _DUCKDB_VERSION / f"{name}.duckdb_extension"
    if not found.is_file():
        raise LakeError(f"{found}: no such extension for DuckDB {duckdb.__version__}; install "
                        f"{package}=={duckdb.__version__}")
    return found


def _as_named(source: Path, name: str) -> Path:
    """`source` under the file name DuckDB derives the extension's entry point from.

    duckdb-extension-sqlite ships `sqlite.duckdb_extension`, whose entry point is sqlite_scanner's (and
    likewise postgres).
    """
    folder = Path(tempfile.gettempdir()) / f"specdec-extensions-{os.getuid()}-{_DUCKDB_VERSION}"
    folder.mkdir(mode=0o700, exist_ok=True)
    link = folder / f"{name}.duckdb_extension"
    if not (link.is_symlink() and os.readlink(link) == str(source)):
        tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(source)
        os.replace(tmp, link)
    return link


def _extension_files(location: LakeLocation) -> list[Path]:
    """The extensions a store's instance loads, in order."""
    scanner = ("postgres", "postgres_scanner") if location.postgres else ("sqlite", "sqlite_scanner")
    files = [_extension_file("duckdb-extension-ducklake", "ducklake"),
             _as_named(_extension_file(f"duckdb-extension-{scanner[0]}", scanner[0]), scanner[1])]
    if location.on_s3:
        files.append(_extension_file("duckdb-extension-httpfs", "httpfs"))
    return files


# Extension files whose signature an instance of this process checked, as they were then. DuckDB checks it at
# every LOAD by hashing the whole file, a cost paid by every reader and writer instance (docs/benchmarks.md).
# The same file, unchanged, is loaded into the next instances without checking it again.
_checked: set[tuple[str, int, int, int, int]] = set()


def _as_found(file: Path) -> tuple[str, int, int, int, int]:
    real = os.path.realpath(file)
    st = os.stat(real)
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _s3_secret(con: duckdb.DuckDBPyConnection, location: LakeLocation) -> None:
    """S3 credentials from the environment (never from the file), the endpoint and style from [store]."""
    settings = dict(location.s3)
    values = {"KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", ""),
              "SECRET": os.environ.get("AWS_SECRET_ACCESS_KEY", "")}
    for key, option in (("s3_endpoint", "ENDPOINT"), ("s3_region", "REGION"), ("s3_url_style", "URL_STYLE")):
        if key in settings:
            values[option] = settings[key]
    parts = ["TYPE s3", *(f"{option} {literal(value)}" for option, value in values.items())]
    if "s3_use_ssl" in settings:
        parts.append(f"USE_SSL {'true' if settings['s3_use_ssl'].lower() in ('1', 'true', 'yes') else 'false'}")
    # CREATE SECRET takes no parameters: the credentials are quoted into the statement, never logged.
    con.execute("CREATE OR REPLACE SECRET specdec_s3 (" + ", ".join(parts) + ")")


def new_instance(location: LakeLocation) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB instance with the extensions `location` needs loaded (raises duckdb.Error)."""
    files = _extension_files(location)
    found = [_as_found(file) for file in files]
    checked = all(f in _checked for f in found)
    con = duckdb.connect(":memory:", config={**instance_config(), "autoinstall_known_extensions": False,
                                              "autoload_known_extensions": False,
                                              "allow_unsigned_extensions": checked})
    try:
        for file in files:
            con.execute(f"LOAD {literal(str(file))}")
        _checked.update(found)
        if location.on_s3:
            _s3_secret(con, location)
    except BaseException:
        con.close()
        raise
    return con
