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
    answers = _probe_engines(registry)
    for name in registry.model_names:
        spec = registry.models[name]
        if spec.engine is not None:
            state = "engine" if answers[spec.engine][0] else "engine-down"
            print(f"model\t{name}\t{state}\treplays on {spec.source}")
            continue
        state = "ready" if spec.is_available() else "missing"
        print(f"model\t{name}\t{state}\tin-process, {spec.source}")
    for name in registry.tokenizer_names:
        spec = registry.tokenizers[name]
        state = "ready" if registry.is_available(name) else "missing"
        norm = "+".join(spec.normalize) or "none"
        print(f"tokenizer\t{name}\t{state}\tchat_template={str(spec.chat_template).lower()} normalize={norm}")
    print("draft\tngram-N\tready\tprompt lookup, n-grams up to N")
    for name, spec in sorted(registry.engines.items()):
        ok, said = answers[name]
        key = f", key from ${spec.api_key_env}" if spec.api_key_env else ""
        print(f"engine\t{name}\t{'answers' if ok else 'down'}\t{spec.url} (max_concurrency {spec.max_concurrency}, "
              f"timeout {spec.timeout_s:g} s{key}): {said}")
    return 0


def _probe_engines(registry: object) -> dict[str, tuple[bool, str]]:
    """Whether each engine answers GET /models, asked side by side with a short timeout."""
    from concurrent.futures import ThreadPoolExecutor

    from specdec_core.decoding.engine_client import probe

    engines = getattr(registry, "engines", {})
    if not engines:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(engines))) as pool:
        return dict(zip(engines, pool.map(probe, engines.values()), strict=True))
