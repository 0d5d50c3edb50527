"""Logs in object storage: `s3://bucket/prefix/...` paths (globs too), listed and read through DuckDB's httpfs.

The extension is LOADed from its PyPI wheel (duckdb-extension-httpfs, the lake extra), never downloaded.
Credentials come from $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY only; the endpoint, region, URL style
and TLS from specdec.toml's `[logs]` table. Each object is fetched into a temporary file that keeps its
suffix, and read there by the same readers as a local file, under its URL.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from specdec_core.extras import require
from specdec_core.formats.files import SUPPORTED_SUFFIXES, LogReadError, is_json_document
from specdec_core.settings_file import default_config_path, tomllib
from specdec_core.store.sql import literal

SCHEME = "s3://"
_LOGS_KEYS = ("s3_endpoint", "s3_region", "s3_url_style", "s3_use_ssl")
_PATTERN_CHARS = "*?["


def is_s3(spec: str) -> bool:
    return str(spec).lower().startswith(SCHEME)


@dataclass(frozen=True)
class S3Settings:
    endpoint: str | None = None  # host:port, no scheme
    region: str | None = None
    url_style: str | None = None  # "path" or "vhost"
    use_ssl: bool | None = None


@dataclass(frozen=True)
class S3Object:
    url: str
    size: int
    modified: str  # the store's last-modified time, as text: with the size, what tells a new version

    @property
    def version(self) -> str:
        return f"{self.size}:{self.modified}"


def logs_settings(config: Path | None = None) -> S3Settings:
    """The `[logs]` table of specdec.toml (absent: all defaults); a bad one is a one-line LogReadError."""
    source = config or default_config_path()
    if not source.is_file():
        return S3Settings()
    try:
        with open(source, "rb") as fh:
            table = tomllib.load(fh).get("logs", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LogReadError(f"{source}: cannot read the [logs] table: {exc}") from None
    if not isinstance(table, dict):
        raise LogReadError(f"{source}: [logs] must be a table")
    unknown = sorted(set(table) - set(_LOGS_KEYS))
    if unknown:
        raise LogReadError(f"{source}: [logs] has no setting {unknown[0]!r}; it takes {', '.join(_LOGS_KEYS)}")
    use_ssl = table.get("s3_use_ssl")
    if use_ssl is not None and not isinstance(use_ssl, bool):
        raise LogReadError(f"{source}: [logs] s3_use_ssl must be true or false")
    style = table.get("s3_url_style")
    if style is not None and style not in ("path", "vhost"):
        raise LogReadError(f"{source}: [logs] s3_url_style must be \"path\" or \"vhost\", not {style!r}")
    endpoint = table.get("s3_endpoint")
    if endpoint is not None and "://" in str(endpoint):
        raise LogReadError(f"{source}: [logs] s3_endpoint is host:port, without a scheme (use s3_use_ssl)")
    return S3Settings(endpoint=endpoint, region=table.get("s3_region"), url_style=style, use_ssl=use_ssl)


def _httpfs_file() -> Path:
    module = require("lake", "duckdb_extension_httpfs")
    found = Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "httpfs.duckdb_extension"
    if not found.is_file():
        raise LogReadError(f"{found}: no httpfs extension for DuckDB {duckdb.__version__}; install "
                           f"duckdb-extension-httpfs=={duckdb.__version__}")
    return found


def connect(settings: S3Settings | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with httpfs loaded and the S3 secret made from the environment and `[logs]`."""
    settings = settings or logs_settings()
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                              "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD {literal(str(_httpfs_file()))}")
        parts = ["TYPE s3", f"KEY_ID {literal(os.environ.get('AWS_ACCESS_KEY_ID', ''))}",
                 f"SECRET {literal(os.environ.get('AWS_SECRET_ACCESS_KEY', ''))}"]
        if os.environ.get("AWS_SESSION_TOKEN"):
            parts.append(f"SESSION_TOKEN {literal(os.environ['AWS_SESSION_TOKEN'])}")
        for option, value in (("ENDPOINT", settings.endpoint), ("REGION", settings.region),
                              ("URL_STYLE", settings.url_style)):
            if value is not None:
                parts.append(f"{option} {literal(str(value))}")
        if settings.use_ssl is not None:
            parts.append(f"USE_SSL {'true' if settings.use_ssl else 'false'}")
        # CREATE SECRET takes no parameters: the credentials are quoted into the statement, never logged.
        con.execute("CREATE OR REPLACE SECRET specdec_logs (" + ", ".join(parts) + ")")
    except BaseException:
        con.close()
        raise
    return con


def _readable(url: str) -> bool:
    name = url.rsplit("/", 1)[-1].lower()
    return name.endswith(SUPPORTED_SUFFIXES)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def list_objects(con: duckdb.DuckDBPyConnection, spec: str, *, missing_ok: bool = False) -> list[S3Object]:
    """The log objects `spec` names: an object, every log under a prefix, or what a glob matches."""
    def glob(pattern: str) -> list[str]:
        return [row[0] for row in con.execute("SELECT file FROM glob(?) ORDER BY file", [pattern]).fetchall()]

    try:
        if any(ch in spec for ch in _PATTERN_CHARS):
            urls = [u for u in glob(spec) if _readable(u) or (is_json_document(u) and is_json_document(spec))]
        else:
            exact = [] if spec.endswith("/") else glob(spec)
            urls = exact or [u for u in glob(spec.rstrip("/") + "/**") if _readable(u)]
        if not urls:
            if missing_ok:
                return []
            raise LogReadError(f"{spec}: no supported log object there")
        rows = con.execute("SELECT filename, size, last_modified FROM read_blob(?) ORDER BY filename",
                           [urls]).fetchall()
    except duckdb.Error as exc:
        raise LogReadError(f"{spec}: cannot be read: {_one_line(exc)}") from None
    return [S3Object(url, int(size), modified.isoformat() if isinstance(modified, datetime) else str(modified))
            for url, size, modified in rows]


def _suffix(url: str) -> str:
    name = url.rsplit("/", 1)[-1].lower()
    return max((s for s in (*SUPPORTED_SUFFIXES, ".json") if name.endswith(s)), key=len, default="")


def download(con: duckdb.DuckDBPyConnection, url: str, dest: Path) -> None:
    try:
        row = con.execute("SELECT content FROM read_blob(?)", [url]).fetchone()
    except duckdb.Error as exc:
        raise LogReadError(f"{url}: cannot be read: {_one_line(exc)}") from None
    if row is None:
        raise LogReadError(f"{url}: no such object")
    dest.write_bytes(row[0])


@contextmanager
def fetched(paths: list[str], objects: list[S3Object] | None = None
            ) -> Iterator[tuple[list[str], dict[Path, tuple[str, int]]]]:
    """`paths` with each s3:// one replaced by local copies of its objects (or `objects`, already listed), and
    {local copy: (its URL, 0)} for the ingest to record each row under its URL."""
    if objects is None and not any(is_s3(p) for p in paths):
        yield paths, {}
        return
    con = connect()
    try:
        with tempfile.TemporaryDirectory(prefix="specdec-s3-") as tmp:
            local: list[str] = []
            names: dict[Path, tuple[str, int]] = {}
            wanted = objects if objects is not None else []
            if objects is None:
                for spec in paths:
                    if is_s3(spec):
                        wanted.extend(list_objects(con, spec))
                    else:
                        local.append(spec)
            else:
                local = [p for p in paths if not is_s3(p)]
            for n, obj in enumerate(wanted):
                dest = Path(tmp) / f"object-{n}{_suffix(obj.url)}"
                download(con, obj.url, dest)
                local.append(str(dest))
                names[dest.resolve()] = (obj.url, 0)
            yield local, names
    finally:
        con.close()
