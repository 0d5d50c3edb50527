"""Where specdec.toml is (the model registry, [dashboard] and [store] share it), found without importing
anything heavy: reading the [store] table must not load torch."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

CONFIG_ENV = "SPECDEC_CONFIG"
CONFIG_NAME = "specdec.toml"
REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["CONFIG_ENV", "CONFIG_NAME", "REPO_ROOT", "default_config_path", "tomllib"]


def default_config_path() -> Path:
    """$SPECDEC_CONFIG, else specdec.toml in the working folder, else the repo's."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    local = Path.cwd() / CONFIG_NAME
    return local if local.is_file() else REPO_ROOT / CONFIG_NAME
