"""The model registry (TOML), its errors, the loader cache, GGUF loading and `specdec models`."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from specdec_core.cli import main
from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.decoding.loader import ModelLoader
from specdec_core.decoding.proposers import ngram_size
from specdec_core.decoding.registry import (
    Registry,
    RegistryError,
    UnknownModelError,
)
from specdec_core.demo.models import FAMILY_DIRS, registry_dict
from specdec_core.settings_file import REPO_ROOT

TOML = """\
[models.tiny-target]
path = "weights/target"

[models.tiny-gguf]
gguf = "weights/model.gguf"

[models.from-hub]
hub_id = "org/model"
revision = "v1"

[tokenizers.tok-a]
path = "weights/tokenizer"
chat_template = true
normalize = "nfkc+lower"

[tokenizers.tok-b]
model = "tiny-target"
normalize = ["collapse_whitespace"]
"""


def write(tmp_path: Path, text: str, name: str = "specdec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def one_line(err: Exception) -> str:
    message = str(err)
    assert "\n" not in message
    return message


def test_registry_reads_models_and_tokenizers_with_paths_relative_to_the_file(tmp_path):
    reg = Registry.from_toml(write(tmp_path, TOML))
    assert reg.model_names == ["from-hub", "tiny-gguf", "tiny-target"]
    assert reg.model("tiny-target").path == tmp_path / "weights/target"
    assert reg.model("tiny-gguf").gguf == tmp_path / "weights/model.gguf"
    assert reg.model("from-hub").hub_id == "org/model"
    tok_a, tok_b = reg.tokenizer("tok-a"), reg.tokenizer("tok-b")
    assert tok_a.chat_template and tok_a.normalize == ("nfkc", "lower")
    assert tok_b.model == "tiny-target" and not tok_b.chat_template
    assert tok_a.preprocess("\ufb01ne  DAY") == "fine  day"
    assert tok_b.preprocess("  a \t b\n") == "a b"


def test_registry_knows_names_without_loading_anything(tmp_path):
    reg = Registry.from_toml(write(tmp_path, TOML))
    assert reg.knows("tiny-target") and not reg.knows("tiny-draft")
    assert reg.knows("ngram-3", "draft") and reg.knows(None, "draft") and reg.knows("none", "draft")
    assert not reg.knows("ngram-3") and not reg.knows("ngram-0", "draft")
    assert reg.knows("tok-a", "tokenizer") and not reg.knows("tok-z", "tokenizer")
    assert ngram_size("ngram-12") == 12 and ngram_size("ngram-x") is None
    r = DecodeRequest(target_model="big", tokenizer_version="tok-a", max_tokens=3, prompt="x", draft_model="small")
    assert reg.unknown_names(r) == {"target_model": "big", "draft_model": "small"}
    assert not reg.is_available("tiny-target")  # registered, but nothing on disk


def test_an_unknown_model_error_lists_the_known_names(tmp_path):
    reg = Registry.from_toml(write(tmp_path, TOML))
    with pytest.raises(UnknownModelError) as err:
        reg.model("tiny-targt")
    assert isinstance(err.value, ValueError)
    assert (err.value.name, err.value.kind) == ("tiny-targt", "model")
    message = one_line(err.value)
    assert "'tiny-targt'" in message and "from-hub, tiny-gguf, tiny-target" in message
    with pytest.raises(UnknownModelError, match="tok-a, tok-b"):
        reg.tokenizer("tok-c")


def test_a_missing_registry_file_is_one_clear_line(tmp_path):
    with pytest.raises(RegistryError) as err:
        Registry.from_toml(tmp_path / "nope.toml")
    message = one_line(err.value)
    assert "nope.toml" in message and "not found" in message and "SPECDEC_CONFIG" in message


def test_bad_toml_is_one_clear_line(tmp_path):
    path = write(tmp_path, "[models.a]\npath = \n")
    with pytest.raises(RegistryError) as err:
        Registry.from_toml(path)
    message = one_line(err.value)
    assert str(path) in message and "not valid TOML" in message and "line 2" in message


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[models.a]\npath = "x"\ngguf = "y.gguf"\n', "exactly one of"),
        ("[models.a]\n", "exactly one of"),
        ('[models.a]\npaht = "x"\n', "unknown key(s) paht"),
        ('[models.ngram-2]\npath = "x"\n', "reserved"),
        ('[tokenizers.t]\npath = "x"\nnormalize = "nfkd"\n', "unknown normalize step"),
        ('[tokenizers.t]\nmodel = "m"\n', "has no [models.m] entry"),
        ('[tokenizers.t]\npath = "x"\nchat_template = "yes"\n', "true or false"),
        ('[model.a]\npath = "x"\n', "unknown table(s) model"),
    ],
)
def test_bad_entries_are_one_clear_line(tmp_path, text, expected):
    with pytest.raises(RegistryError) as err:
        Registry.from_toml(write(tmp_path, text))
    assert expected in one_line(err.value)


def test_specdec_config_env_points_at_the_registry(tmp_path, monkeypatch):
    path = write(tmp_path, TOML, "elsewhere.toml")
    monkeypatch.setenv("SPECDEC_CONFIG", str(path))
    assert Registry.load().source == path


def test_the_repo_registry_maps_the_demo_families():
    reg = Registry.from_toml(REPO_ROOT / "specdec.toml")
    for name in ("tiny-target", "tiny-draft-a", "tiny-draft-b", "smollm2-135m", "smollm2-135m-draft-l4"):
        assert reg.knows(name)
    for name in ("tiny-tok-v1", "tiny-tok-v2", "tok-v1", "tok-v2"):
        assert reg.knows(name, "tokenizer")
    assert reg.model("tiny-target").path == REPO_ROOT / "data/models/tiny/tiny-target"
    # the file and the builder agree on every name and setting
    expected = Registry.from_dict(registry_dict(REPO_ROOT / "data/models"))
    assert reg.models == expected.models and reg.tokenizers == expected.tokenizers


def test_missing_weights_fail_at_load_with_one_line_naming_the_fix(tmp_path):
    reg = Registry.from_toml(write(tmp_path, TOML))
    with pytest.raises(RegistryError) as err:
        ModelLoader(reg).model("tiny-target")
    message = one_line(err.value)
    assert "weights/target" in message and "specdec models fetch" in message


def test_the_loader_keeps_at_most_capacity_models(tiny_registry):
    small = ModelLoader(tiny_registry, capacity=1)
    for name in ("tiny-draft-a", "tiny-draft-b", "tiny-draft-a"):
        small.model(name)
    assert small.load_count == 3 and small.loaded() == ["tiny-draft-a"]
    roomy = ModelLoader(tiny_registry, capacity=2)
    for name in ("tiny-draft-a", "tiny-draft-b", "tiny-draft-a", "tiny-draft-b"):
        roomy.model(name)
    assert roomy.load_count == 2
    assert roomy.tokenizer("tiny-tok-v1") is roomy.tokenizer("tiny-tok-v2")  # same files, one object
    assert roomy.tokenizer_load_count == 1


# --- GGUF ------------------------------------------------------------------------------------


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for rotary embeddings (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model_dir: Path, out: Path) -> None:
    """A GGUF file of a save_pretrained Llama, as llama.cpp's converter lays it out (float32)."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    state = load_file(str(model_dir / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-target")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_eos_token_id(cfg.eos_token_id)
    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = state[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = _llama_cpp_permute(t, cfg.num_attention_heads)
            elif gg == "attn_k":
                t = _llama_cpp_permute(t, cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_model_loads_through_the_registry_and_decodes_like_its_source(tiny_registry, tmp_path):
    source = tiny_registry.model("tiny-target").path
    write_llama_gguf(source, tmp_path / "tiny.gguf")
    tokenizer = tiny_registry.tokenizer("tiny-tok-v1").path
    reg = Registry.from_toml(write(tmp_path, f"""
[models.tiny-target]
path = "{source}"
[models.tiny-gguf]
gguf = "tiny.gguf"
[tokenizers.tiny-tok-v1]
path = "{tokenizer}"
"""))
    engine = SpecDecoder(reg, device="cpu")
    for prompt in ("The cache key", "Once upon a time", "hello there"):
        base = dict(tokenizer_version="tiny-tok-v1", max_tokens=16, prompt=prompt)
        from_folder = engine.generate(DecodeRequest(target_model="tiny-target", **base))
        from_gguf = engine.generate(DecodeRequest(target_model="tiny-gguf", **base))
        assert from_gguf.token_ids == from_folder.token_ids
        assert from_gguf.environment["target_source"].endswith("tiny.gguf")


# --- the command line ------------------------------------------------------------------------


def test_models_list_shows_names_and_whether_they_are_on_disk(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CONFIG", str(write(tmp_path, TOML)))
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "model\ttiny-target\tmissing" in out
    assert "tokenizer\ttok-a\tmissing\tchat_template=true normalize=nfkc+lower" in out
    assert "ngram-N" in out


def test_models_list_with_a_broken_registry_exits_1_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CONFIG", str(write(tmp_path, "[models\n")))
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid TOML" in err


def test_models_fetch_of_a_built_family_returns_at_once(tiny_registry, capsys):
    models_dir = tiny_registry.model("tiny-target").path.parents[1]
    assert models_dir.name != FAMILY_DIRS["tiny"]
    started = time.perf_counter()
    assert main(["models", "fetch", "--family", "tiny", "--models-dir", str(models_dir)]) == 0
    assert time.perf_counter() - started < 2.0
    out = capsys.readouterr().out
    assert f"tiny-target\t{models_dir / 'tiny' / 'tiny-target'}" in out


def test_models_fetch_rejects_an_unknown_family(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["models", "fetch", "--family", "huge"])
    assert exit_.value.code == 2


def test_loaders_in_two_threads_at_once_both_get_real_weights(tiny_registry):
    """The dashboard preloads models while a replay loads them: transformers' meta-device loading is
    process-wide, and two loads at once left one model with meta tensors."""
    import threading

    loaded: list = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def load() -> None:
        start.wait()
        try:
            loaded.append(ModelLoader(tiny_registry).model("tiny-target"))
        except BaseException as exc:  # noqa: BLE001 (a thread's error is asserted on below)
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and len(loaded) == 4
    assert not any(p.is_meta for model in loaded for p in model.parameters())
