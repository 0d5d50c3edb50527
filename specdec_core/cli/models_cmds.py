"""`specdec models fetch|list`: build the demo model families, show what the registry maps."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
    from specdec_core.text import escape_controls

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
            answer = answers[spec.engine]
            unserved = served_name_problem(name, spec.model_on_engine, spec.engine, answer.names,
                                           answer.answers)
            state = "engine-unserved" if unserved else "engine" if answer.answers else "engine-down"
            print(f"model\t{name}\t{state}\treplays on {escape_controls(spec.source)}"
                  + (f": {unserved}" if unserved else ""))
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
        answer = answers[name]
        key = f", key from ${spec.api_key_env}" if spec.api_key_env else ""
        print(f"engine\t{name}\t{'answers' if answer.answers else 'down'}\t{spec.url} (max_concurrency "
              f"{spec.max_concurrency}, timeout {spec.timeout_s:g} s{key}): {answer.said}")
    return 0


def served_name_problem(model: str, served_name: str, engine: str, names: Sequence[str], answers: bool) -> str | None:
    """Why every replay of `model` would fail on an engine that serves other names, with the served_name to set."""
    if not answers or served_name in names:
        return None
    from specdec_core.decoding.engine_client import shown

    if not names:
        return f"engine {engine} lists no model, and every replay asks for {shown(served_name, 80)!r}"
    if len(names) == 1:
        fix = f'set served_name = "{shown(names[0], 200)}" in [models.{model}]'
    else:
        fix = f"set served_name in [models.{model}] to one of {', '.join(repr(shown(n, 80)) for n in names[:8])}"
    return (f"engine {engine} does not serve {shown(served_name, 80)!r}, so every replay of it would fail; {fix}")


def _probe_engines(registry: object) -> dict[str, Any]:
    """Whether each engine answers GET /models, asked side by side with a short timeout."""
    from concurrent.futures import ThreadPoolExecutor

    from specdec_core.decoding.engine_client import probe

    engines = getattr(registry, "engines", {})
    if not engines:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(engines))) as pool:
        return dict(zip(engines, pool.map(probe, engines.values()), strict=True))
