"""Where the store is: a DuckDB file (the local default), or a DuckLake shared by several machines.

`--db` names either: a path, or `ducklake:CATALOG`. Without --db: $SPECDEC_DB, then the shared store
of $SPECDEC_STORE or specdec.toml's `[store]` table, then data/specdec.duckdb:

    [store]
    catalog = "postgres:dbname=specdec host=db.internal user=triage"  # or a SQLite file's path
    data_path = "s3://incident-logs/specdec/"   # where the Parquet files go; $SPECDEC_STORE_DATA too
    s3_endpoint = "s3.eu-west-1.amazonaws.com"  # optional, with s3_region, s3_url_style, s3_use_ssl

A SQLite catalog keeps its files in `CATALOG.files/` unless data_path says otherwise; PostgreSQL
needs data_path when the store is made (DuckLake remembers it after). S3 credentials come from
$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, never from the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from specdec_core.settings_file import default_config_path, tomllib

DEFAULT_DB = "data/specdec.duckdb"
STORE_ENV = "SPECDEC_STORE"
STORE_DATA_ENV = "SPECDEC_STORE_DATA"
LAKE_PREFIX = "ducklake:"
_S3_KEYS = ("s3_endpoint", "s3_region", "s3_url_style", "s3_use_ssl")
_STORE_KEYS = {"catalog", "data_path", *_S3_KEYS}


MASK = "***"
# A password in a libpq keyword/value string (password=..., quoted or not) or in a URI (user:PASSWORD@host,
# ?password=...): what a catalog string may hold that no message may show.
_KEYWORD_SECRET = re.compile(r"(?i)(?<![?&\w])(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"]+)")
_URI_SECRET = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)")
_QUERY_SECRET = re.compile(r"(?i)([?&]\w*password=)([^&\s#\"']+)")


def secrets_in(catalog: str) -> tuple[str, ...]:
    """The passwords a catalog string holds, as they appear in it and unquoted (libpq's quoting)."""
    found: list[str] = []
    for match in _KEYWORD_SECRET.finditer(catalog):
        value = match.group(2)
        found.append(value)
        if value.startswith("'"):
            found.append(re.sub(r"\\(.)", r"\1", value[1:-1]))
    found += [m.group(2) for m in _URI_SECRET.finditer(catalog)]
    found += [m.group(2) for m in _QUERY_SECRET.finditer(catalog)]
    return tuple(sorted({f for f in found if f and f != MASK}, key=len, reverse=True))


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every password shown as ***: those `secrets` names wherever they appear (a database's own
    error quotes the connection string in its own way), and any keyword, URI or query-string password."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _KEYWORD_SECRET.sub(lambda m: m.group(1) + MASK, text)
    text = _URI_SECRET.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)


class LocationError(ValueError):
    """The [store] table or a ducklake: name can't be used; the message is one line."""


@dataclass(frozen=True)
class LakeLocation:
    """A DuckLake: its catalog (a SQLite file's absolute path, or `postgres:<libpq string>`) and data path."""

    catalog: str
    data_path: str | None
    s3: tuple[tuple[str, str], ...] = field(default=())
    beside: bool = False  # the data files are in CATALOG.files/: the two move together

    @property
    def postgres(self) -> bool:
        return self.catalog.startswith("postgres:")

    @property
    def on_s3(self) -> bool:
        return bool(self.data_path and self.data_path.startswith("s3://"))

    @property
    def attach_target(self) -> str:
        return self.catalog if self.postgres else "sqlite:" + self.catalog

    def __str__(self) -> str:
        """The store's name as messages show it: its password masked."""
        return self.mask(LAKE_PREFIX + self.catalog)

    def mask(self, text: str) -> str:
        """`text` (a message about this lake, a database's error) with the catalog's password masked."""
        return mask_secrets(text, secrets_in(self.catalog))


def _store_table() -> dict:
    source = default_config_path()
    if not source.is_file():
        return {}
    try:
        table = tomllib.loads(source.read_text(encoding="utf-8")).get("store", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LocationError(f"{source}: cannot read the [store] table: {exc}") from None
    if not isinstance(table, dict):
        raise LocationError(f"{source}: [store] must be a table")
    unknown = sorted(set(table) - _STORE_KEYS)
    if unknown:
        raise LocationError(f"{source}: [store] has no setting {unknown[0]!r}; it takes {', '.join(sorted(_STORE_KEYS))}")
    return table


def resolve_db(path: str | os.PathLike[str] | None = None) -> str:
    """The store to use: `path` (a file or ducklake:CATALOG), $SPECDEC_DB, the configured shared store, or the default."""
    chosen = path or os.environ.get("SPECDEC_DB")
    if chosen:
        return str(chosen)
    catalog = os.environ.get(STORE_ENV) or _store_table().get("catalog")
    if catalog:
        return catalog if catalog.startswith(LAKE_PREFIX) else LAKE_PREFIX + catalog
    return DEFAULT_DB


def lake_location(name: str) -> LakeLocation | None:
    """The DuckLake `name` (ducklake:CATALOG) stands for; None when it names a DuckDB file."""
    if not name.startswith(LAKE_PREFIX):
        return None
    catalog = name[len(LAKE_PREFIX):]
    if catalog.startswith("sqlite:"):
        catalog = catalog[len("sqlite:"):]
    if not catalog:
        raise LocationError(f"{name}: names no catalog; write ducklake:PATH (SQLite) or ducklake:postgres:...")
    table = _store_table()
    configured = table.get("catalog", "")
    configured = configured[len(LAKE_PREFIX):] if configured.startswith(LAKE_PREFIX) else configured
    is_configured = configured in (catalog, "sqlite:" + catalog)
    data_path = os.environ.get(STORE_DATA_ENV) or (table.get("data_path") if is_configured else None)
    s3 = tuple((k, str(table[k])) for k in _S3_KEYS if k in table) if is_configured else ()
    beside = False
    if not catalog.startswith("postgres:"):
        catalog = os.path.realpath(catalog)  # through a symlink to its target: the link stays a link
        beside = not data_path
        data_path = data_path or catalog + ".files" + os.sep
    if data_path and not data_path.endswith(("/", os.sep)):
        data_path += "/"
    if data_path and not data_path.startswith("s3://"):
        data_path = os.path.abspath(data_path) + os.sep
    for what, path in (("catalog", catalog), ("data path", data_path)):
        if not catalog.startswith("postgres:") and path and "\\" in path:
            # DuckDB's file system takes a backslash for a folder separator: the data files would go elsewhere.
            raise LocationError(f"{name}: the lake's {what} {path} holds a backslash, which DuckDB reads as a "
                                "folder separator; choose a path without one")
    return LakeLocation(catalog, data_path, s3, beside)
