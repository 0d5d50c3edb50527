"""`specdec models fetch|list`: build the demo model families, show what the registry maps."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="demo models and the model registry")
    sub = models.add_subparsers(dest="models_command", metavar="ACTION")
    sub.required = True

    fetch = sub.add_parser("fetch", help="build the demo model families (instant when already built)")
    fetch.add_argument("--family", choices=["tiny", "smollm2", "all"], default="all")
    fetch.add_argument("--models-dir", type=Path, default=None, help="default: data/models/ in the repo")
    fetch.set_defaults(func=cmd_fetch)

    lst = sub.add_parser("list", help="the registry's models and tokenizer versions, and whether they are on disk")
    lst.add_argument("--config", type=Path, default=None, help="registry TOML (default: $SPECDEC_CONFIG or specdec.toml)")
    lst.set_defaults(func=cmd_list)


def cmd_fetch(args: argparse.Namespace) -> int:
    from specdec_core.demo.models import DEFAULT_MODELS_DIR, fetch

    started = time.perf_counter()
    _quiet_transformers()
    try:
        paths = fetch(args.family, args.models_dir or DEFAULT_MODELS_DIR)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"specdec: models fetch: {e}", file=sys.stderr)
        return 1
    for name, path in sorted(paths.items()):
        print(f"{name}\t{path}")
    print(f"ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _quiet_transformers() -> None:
    """Loading and saving local files needs no per-shard progress bars on the terminal.

    Set before transformers is imported (it reads this once), so an up-to-date fetch
    never pays for importing it.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def cmd_list(args: argparse.Namespace) -> int:
    from specdec_core.decoding.registry import Registry, RegistryError

    try:
        registry = Registry.load(args.config)
    except RegistryError as e:
        print(f"specdec: {e}", file=sys.stderr)
        return 1
    print(f"# {registry.source}")
    for name in registry.model_names:
        spec = registry.models[name]
        state = "ready" if spec.is_available() else "missing"
        print(f"model\t{name}\t{state}\t{spec.source}")
    for name in registry.tokenizer_names:
        spec = registry.tokenizers[name]
        state = "ready" if registry.is_available(name) else "missing"
        norm = "+".join(spec.normalize) or "none"
        print(f"tokenizer\t{name}\t{state}\tchat_template={str(spec.chat_template).lower()} normalize={norm}")
    print("draft\tngram-N\tready\tprompt lookup, n-grams up to N")
    return 0
