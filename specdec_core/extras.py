"""The optional parts of specdec-triage and the pip extra that installs each.

`pip install specdec-triage` gives the contract, the keys, the in-process cache, the store,
ingest, analysis, the report and the CLI for them. Everything else sits behind an extra,
imported only where it is used, through `require`, so that a missing one is one line
saying what to install rather than a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# extra -> the top-level modules it provides (the names pyproject.toml's extras install).
EXTRAS: dict[str, tuple[str, ...]] = {
    "replay": ("torch", "transformers", "tokenizers", "safetensors", "gguf", "accelerate"),
    "dashboard": ("streamlit", "plotly"),
    "redis": ("redis",),
    "lake": ("duckdb_extension_ducklake", "duckdb_extension_sqlite", "duckdb_extension_postgres",
             "duckdb_extension_httpfs"),
    "otel": ("opentelemetry",),
    "metrics": ("prometheus_client", "yaml"),
    "collect": ("opentelemetry", "grpc", "google"),
}


class MissingExtra(ImportError):
    """A feature's optional dependency is not installed; the message names the extra to install."""

    def __init__(self, extra: str, module: str) -> None:
        self.extra = extra
        super().__init__(f"needs the {extra} extra ({module} is not installed): {install_hint(extra)}",
                         name=module)


def install_hint(extra: str) -> str:
    return f"pip install 'specdec-triage[{extra}]'"


def require(extra: str, module: str) -> ModuleType:
    """`module`, imported; MissingExtra naming `extra` when it (not something it imports) is absent.

    A module that is installed but broken (one of its own imports fails) still raises its own
    error: reinstalling the extra would not fix that, so saying so would mislead.
    """
    if module.split(".")[0] not in EXTRAS[extra]:
        raise ValueError(f"{module} is not part of the {extra} extra")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(f"{exc.name}.")):
            raise MissingExtra(extra, exc.name) from None
        raise

