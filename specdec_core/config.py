"""The dashboard's settings: which key functions it may run and which folders it may open.

They live in the `[dashboard]` table of the same file as the model registry (specdec.toml,
or the file $SPECDEC_CONFIG names):

    [dashboard]
    audit_functions = ["mypkg.keys:make_key"]   # default: none
    roots = ["data", "/srv/triage"]              # default: the repo's data/ and the start folder
    external_url = "https://triage.example.com"  # links from alerts and Grafana (`specdec metrics`)

The dashboard has no login: whoever reaches it may type into it. So it imports no code and
opens no path the operator did not name here; the CLI, run by someone with a shell already,
keeps its full power.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specdec_core.settings_file import CONFIG_ENV, REPO_ROOT, default_config_path, tomllib

_DASHBOARD_KEYS = {"audit_functions", "roots", "external_url"}


class ConfigError(ValueError):
    """The [dashboard] table can't be used; the message is one line and names the file."""


class PathRefused(ValueError):
    """A path outside the folders the dashboard may open; the message says how to allow it."""


_ONE_FILE = "a database is one DuckDB file (`specdec ingest LOGS --db FILE.duckdb` makes one)"


def _shown(text: str, resolved: Path) -> str:
    """A typed path as a refusal names it: with the path it resolved to, where that differs."""
    return text if str(resolved) == text else f"{text} (that is {resolved})"


@dataclass(frozen=True)
class DashboardSettings:
    audit_functions: tuple[str, ...]
    roots: tuple[Path, ...]  # resolved: symlinks and `..` already followed
    source: Path | None = None
    external_url: str | None = None  # where people reach the dashboard: alert and Grafana links point there

    def may_audit(self, target: str) -> bool:
        return target in self.audit_functions

    def with_roots(self, extra: Iterable[Path]) -> DashboardSettings:
        roots = list(self.roots)
        roots += [p for p in (Path(e).resolve() for e in extra) if p not in roots]
        return replace(self, roots=tuple(roots))

    def _where(self) -> str:
        return str(self.source) if self.source else f"specdec.toml (or the file ${CONFIG_ENV} names)"

    def _inside(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def _refuse(self, text: str, resolved: Path) -> PathRefused:
        return PathRefused(f"{_shown(text, resolved)} is outside the folders this dashboard may open "
                           f"({', '.join(str(r) for r in self.roots)}); an operator can add a folder to "
                           f"[dashboard] roots in {self._where()}, or load the files with `specdec ingest`")

    def confine(self, text: str) -> Path:
        """The path `text` names, resolved, if it lies inside a root (a file may not exist yet)."""
        resolved = Path(text).resolve()
        if not self._inside(resolved):
            raise self._refuse(text, resolved)
        return resolved

    def confine_store(self, text: str, allowed: Iterable[str] = ()) -> str:
        """The store `text` names, written the one way it will be opened, if all it opens lies inside a root.

        A store string is a DuckDB file or `ducklake:CATALOG`; for a lake the catalog file and its
        data folder are both checked (the store opens those, not the text). A PostgreSQL catalog or
        data on S3 reach other machines: only a store in `allowed` (what the operator named: the
        config's [store], the dashboard's --db) may do that.
        """
        from specdec_core.store.location import LAKE_PREFIX, LocationError, lake_location

        text = text.strip()
        if text in allowed:
            return text
        if not text.startswith(LAKE_PREFIX):
            # Path("") is the working folder: a blank name opened the folder the dashboard was started in.
            if not text:
                raise PathRefused(f"a blank name is no file; {_ONE_FILE}")
            confined = self.confine(text)
            if confined.is_dir():  # asked only inside a root: no word on what lies outside them
                raise PathRefused(f"{_shown(text, confined)[:300]} is a folder; {_ONE_FILE}")
            return str(confined)
        try:
            lake = lake_location(text)
        except LocationError as exc:
            raise PathRefused(str(exc)) from None
        assert lake is not None
        if lake.postgres or lake.on_s3 or not lake.data_path:
            raise PathRefused(f"{text[:200]} reaches beyond this machine's folders (a PostgreSQL catalog or S3 "
                              f"data); the dashboard opens such a store only when it is the configured one "
                              f"([store] catalog in {self._where()}) or the one it was started with")
        self.confine(lake.catalog)
        self.confine(lake.data_path)
        return LAKE_PREFIX + lake.catalog

    def confine_logs(self, text: str) -> list[str]:
        """The log files a path, folder or glob names, each checked after following its symlinks.

        The part before the first wildcard is checked before anything is listed, so a pattern
        can't walk a folder outside the roots; every match is checked again, as a link inside a
        root may point out of it.
        """
        from specdec_core.formats.files import resolve_paths

        literal = text.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
        self.confine(literal or ".")
        files = resolve_paths([text])
        for f in files:
            resolved = f.resolve()
            if not self._inside(resolved):
                raise self._refuse(str(f), resolved)
        return [str(f) for f in files]


def _strings(value: Any, key: str, where: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where}: [dashboard] {key} must be a list of non-empty strings")
    return tuple(v.strip() for v in value)


def default_roots(start: Path | None = None) -> tuple[Path, ...]:
    """The repo's data folder and the folder the dashboard was started in."""
    roots = [(REPO_ROOT / "data").resolve(), (start or Path.cwd()).resolve()]
    return tuple(dict.fromkeys(roots))


def dashboard_settings(path: Path | str | None = None, start: Path | None = None) -> DashboardSettings:
    """The [dashboard] table of the config file; a missing file or table means the defaults."""
    source = Path(path) if path is not None else default_config_path()
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return DashboardSettings((), default_roots(start), None)
    except OSError as e:
        raise ConfigError(f"config file {source} can't be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {source} is not valid TOML: {' '.join(str(e).split())}") from None
    table = data.get("dashboard") or {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: dashboard must be a table, [dashboard]")
    unknown = sorted(set(table) - _DASHBOARD_KEYS)
    if unknown:
        raise ConfigError(f"{source}: [dashboard] has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(_DASHBOARD_KEYS))}")
    audit = _strings(table.get("audit_functions", []), "audit_functions", source)
    if "roots" in table:
        # Relative roots are relative to the config file, as the registry's model paths are.
        base = source.resolve().parent
        roots: Sequence[Path] = [(base / r).resolve()
                                 for r in _strings(table["roots"], "roots", source)]
    else:
        roots = default_roots(start)
    external_url = table.get("external_url")
    if external_url is not None and (not isinstance(external_url, str) or not external_url.startswith(
            ("http://", "https://"))):
        raise ConfigError(f"{source}: [dashboard] external_url must be an http(s) URL, e.g. "
                          "\"https://triage.example.com\"")
    return DashboardSettings(audit, tuple(dict.fromkeys(roots)), source, external_url)
