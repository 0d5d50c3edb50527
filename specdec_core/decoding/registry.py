"""The model registry: logical names in request logs -> local weights, and the loaded-model cache.

Production logs name models and tokenizer versions (`tiny-target`, `tok-v2`); replay
needs the weights and the exact prompt preprocessing behind those names. Both come
from one TOML file, `specdec.toml`:

    [models.smollm2-135m]
    path = "data/models/smollm2-135m/target"      # a save_pretrained folder
    [models.smollm2-135m-gguf]
    gguf = "data/models/smollm2-135m/model.gguf"   # loaded with transformers' gguf_file=
    [models.my-hub-model]
    hub_id = "org/name"                            # only when a user configures one
    revision = "main"

    [tokenizers.tok-v2]
    path = "data/models/smollm2-135m/tokenizer"    # or gguf / hub_id / model = "<model name>"
    chat_template = true
    normalize = ["nfkc", "collapse_whitespace"]

Relative paths are relative to the TOML file. Draft names `ngram-N` (prompt lookup
with n-grams up to N) need no entry.

A model served elsewhere replays on an OpenAI-compatible engine (vLLM, SGLang, TGI,
`transformers serve`) named in an `[engines.NAME]` table; the URL comes only from this file:

    [engines.staging]
    url = "http://127.0.0.1:8000/v1"
    api_key_env = "STAGING_API_KEY"      # the key is read from the environment when a request is sent
    timeout_s = 60
    max_concurrency = 8
    [models.llama-3.1-70b]
    engine = "staging"
    served_name = "meta-llama/Llama-3.1-70B-Instruct"   # default: the log's name
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_core.decoding.proposers.ngram import ngram_size
from specdec_core.settings_file import CONFIG_ENV, default_config_path, tomllib

# Prompt normalisation steps a tokenizer version may apply, in the order listed.
NORMALIZERS = {
    "none": lambda s: s,
    "nfkc": lambda s: unicodedata.normalize("NFKC", s),
    "nfc": lambda s: unicodedata.normalize("NFC", s),
    "lower": str.lower,
    "strip": str.strip,
    "collapse_whitespace": lambda s: re.sub(r"\s+", " ", s).strip(),
}

_MODEL_KEYS = {"path", "gguf", "hub_id", "revision", "description", "engine", "served_name"}
_ENGINE_KEYS = {"url", "api_key_env", "timeout_s", "max_concurrency", "description"}
_TOKENIZER_KEYS = {"path", "gguf", "hub_id", "revision", "model", "chat_template", "normalize", "description"}
_SOURCE_KEYS = ("path", "gguf", "hub_id")


class RegistryError(ValueError):
    """The registry file or one of its entries can't be used; the message is one line."""


class UnknownModelError(ValueError):
    """A logical name the registry has no entry for."""

    def __init__(self, name: str, kind: str, known: list[str], source: Path | None = None) -> None:
        self.name = name
        self.kind = kind
        self.known = list(known)
        where = f" ({source})" if source else ""
        names = ", ".join(self.known) if self.known else "nothing"
        hint = "; drafts may also be ngram-N" if kind == "draft model" else ""
        super().__init__(f"unknown {kind} {name!r}: the registry{where} knows {names}{hint}")


@dataclass(frozen=True)
class EngineSpec:
    """An OpenAI-compatible server replay may send requests to; only the config file names one."""

    name: str
    url: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_concurrency: int = 4


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path | None = None
    gguf: Path | None = None
    hub_id: str | None = None
    revision: str | None = None
    engine: str | None = None
    served_name: str | None = None

    @property
    def model_on_engine(self) -> str:
        """The name the engine knows this model by."""
        return self.served_name or self.name

    @property
    def source(self) -> str:
        """Where the weights come from, as a string for environments and messages."""
        if self.engine is not None:
            return f"engine:{self.engine}/{self.model_on_engine}"
        if self.gguf is not None:
            return str(self.gguf)
        return str(self.path) if self.path is not None else f"hub:{self.hub_id}"

    def is_available(self) -> bool:
        """Whether the weights are on disk (a hub id or an engine is never checked: it needs the network)."""
        if self.engine is not None:
            return True
        if self.gguf is not None:
            return self.gguf.is_file()
        if self.path is not None:
            return (self.path / "config.json").is_file()
        return True

    def from_pretrained_args(self) -> tuple[str, dict[str, Any]]:
        """(name_or_path, kwargs) for transformers' from_pretrained, raising if the files are missing."""
        if self.gguf is not None:
            if not self.gguf.is_file():
                raise RegistryError(f"{self.name}: GGUF file {self.gguf} not found; run `specdec models fetch`")
            return str(self.gguf.parent), {"gguf_file": self.gguf.name}
        if self.path is not None:
            if not self.path.is_dir():
                raise RegistryError(f"{self.name}: folder {self.path} not found; run `specdec models fetch`")
            return str(self.path), {}
        return str(self.hub_id), {"revision": self.revision} if self.revision else {}


@dataclass(frozen=True)
class TokenizerSpec:
    name: str
    path: Path | None = None
    gguf: Path | None = None
    hub_id: str | None = None
    revision: str | None = None
    model: str | None = None
    chat_template: bool = False
    normalize: tuple[str, ...] = ()

    def preprocess(self, prompt: str) -> str:
        """The prompt text after this version's normalisation (the chat template comes later)."""
        for step in self.normalize:
            prompt = NORMALIZERS[step](prompt)
        return prompt

    def settings(self) -> dict[str, Any]:
        return {"chat_template": self.chat_template, "normalize": list(self.normalize)}


def _resolve(base: Path, value: Any, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise RegistryError(f"{where}: expected a non-empty path string, got {value!r}")
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _check_keys(entry: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        raise RegistryError(f"{where}: expected a table, got {type(entry).__name__}")
    extra = sorted(set(entry) - allowed)
    if extra:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")
    return entry


def _one_source(entry: Mapping[str, Any], where: str, *, also: tuple[str, ...] = ()) -> str:
    given = [k for k in (*_SOURCE_KEYS, *also) if k in entry]
    if len(given) != 1:
        options = " or ".join((*_SOURCE_KEYS, *also))
        raise RegistryError(f"{where}: needs exactly one of {options}, got {given or 'none'}")
    return given[0]


def _parse_engine(name: str, entry: Any) -> EngineSpec:
    where = f"[engines.{name}]"
    entry = _check_keys(entry, _ENGINE_KEYS, where)
    url = entry.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", url):
        raise RegistryError(f"{where}: url must be an http:// or https:// address such as "
                            f"\"http://127.0.0.1:8000/v1\", got {url!r}")
    if "@" in url.split("/")[2]:  # the URL is shown in messages and stored with replays: no credentials in it
        raise RegistryError(f"{where}: url must not hold credentials (user:password@); name the key's "
                            "environment variable in api_key_env")
    authority = url.split("/")[2]
    port = re.fullmatch(r"(?:\[[^\]]*\]|[^:\[\]]+)(?::(.*))?", authority)
    if port is None or (port.group(1) is not None and (not re.fullmatch(r"[0-9]{1,5}", port.group(1))
                                                        or not 1 <= int(port.group(1)) <= 65535)):
        # urlsplit reads other scripts' digits as a port and fails only on connecting past 65535
        raise RegistryError(f"{where}: url must name a port from 1 to 65535 in ASCII digits (or none), "
                            f"got {authority!r}")
    key_env = entry.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key_env)):
        raise RegistryError(f"{where}: api_key_env must name an environment variable, got {key_env!r}")
    timeout = entry.get("timeout_s", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise RegistryError(f"{where}: timeout_s must be a number of seconds in (0, 3600], got {timeout!r}")
    conc = entry.get("max_concurrency", 4)
    if isinstance(conc, bool) or not isinstance(conc, int) or not 1 <= conc <= 256:
        raise RegistryError(f"{where}: max_concurrency must be an integer from 1 to 256, got {conc!r}")
    return EngineSpec(name, url.rstrip("/"), key_env, float(timeout), conc)


def _parse_model(name: str, entry: Any, base: Path, engines: Mapping[str, EngineSpec]) -> ModelSpec:
    where = f"[models.{name}]"
    entry = _check_keys(entry, _MODEL_KEYS, where)
    if "engine" in entry:
        engine, served = entry["engine"], entry.get("served_name")
        if engine not in engines:
            known = ", ".join(sorted(engines)) or "none"
            raise RegistryError(f"{where}: engine {engine!r} has no [engines.{engine}] table (engines: {known})")
        if served is not None and (not isinstance(served, str) or not served):
            raise RegistryError(f"{where}: served_name must be a non-empty string, got {served!r}")
        given = [k for k in _SOURCE_KEYS if k in entry]
        if given:
            raise RegistryError(f"{where}: a model on an engine has no local {given[0]}; give engine or a source")
        return ModelSpec(name, engine=engine, served_name=served)
    if "served_name" in entry:
        raise RegistryError(f"{where}: served_name needs engine = \"NAME\" beside it")
    kind = _one_source(entry, where)
    if kind == "hub_id":
        if not isinstance(entry["hub_id"], str) or not entry["hub_id"]:
            raise RegistryError(f"{where}: hub_id must be a non-empty string")
        return ModelSpec(name, hub_id=entry["hub_id"], revision=entry.get("revision"))
    return ModelSpec(name, **{kind: _resolve(base, entry[kind], f"{where} {kind}")})


def _parse_tokenizer(name: str, entry: Any, base: Path, models: Mapping[str, ModelSpec]) -> TokenizerSpec:
    where = f"[tokenizers.{name}]"
    entry = _check_keys(entry, _TOKENIZER_KEYS, where)
    kind = _one_source(entry, where, also=("model",))
    chat = entry.get("chat_template", False)
    if not isinstance(chat, bool):
        raise RegistryError(f"{where}: chat_template must be true or false, got {chat!r}")
    norm = entry.get("normalize", "none")
    steps = norm.split("+") if isinstance(norm, str) else norm
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise RegistryError(f"{where}: normalize must be a string or a list of strings, got {norm!r}")
    bad = [s for s in steps if s not in NORMALIZERS]
    if bad:
        raise RegistryError(f"{where}: unknown normalize step(s) {bad}; known: {', '.join(NORMALIZERS)}")
    common = {"chat_template": chat, "normalize": tuple(s for s in steps if s != "none")}
    if kind == "model":
        model = entry["model"]
        if model not in models:
            raise RegistryError(f"{where}: model {model!r} has no [models.{model}] entry")
        return TokenizerSpec(name, model=model, **common)
    if kind == "hub_id":
        return TokenizerSpec(name, hub_id=entry["hub_id"], revision=entry.get("revision"), **common)
    return TokenizerSpec(name, **{kind: _resolve(base, entry[kind], f"{where} {kind}")}, **common)


class Registry:
    """Logical model and tokenizer names -> where their weights and preprocessing come from."""

    def __init__(
        self,
        models: Mapping[str, ModelSpec] | None = None,
        tokenizers: Mapping[str, TokenizerSpec] | None = None,
        source: Path | None = None,
        engines: Mapping[str, EngineSpec] | None = None,
    ) -> None:
        self.models: dict[str, ModelSpec] = dict(models or {})
        self.tokenizers: dict[str, TokenizerSpec] = dict(tokenizers or {})
        self.engines: dict[str, EngineSpec] = dict(engines or {})
        self.source = source

    def __repr__(self) -> str:
        return f"Registry({self.source or '<memory>'}: {len(self.models)} models, {len(self.tokenizers)} tokenizers)"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: Path | str = ".", source: Path | None = None) -> Registry:
        base = Path(base_dir)
        # The same file configures the dashboard and the store; their tables are read elsewhere.
        extra = sorted(set(data) - {"models", "tokenizers", "engines", "dashboard", "store"})
        if extra:
            raise RegistryError(f"{source or 'registry'}: unknown table(s) {', '.join(extra)}; use [models.NAME], "
                                "[tokenizers.NAME] and [engines.NAME]")
        engines = {name: _parse_engine(name, e) for name, e in (data.get("engines") or {}).items()}
        models = {name: _parse_model(name, e, base, engines) for name, e in (data.get("models") or {}).items()}
        for name in models:
            if ngram_size(name) is not None:
                raise RegistryError(f"[models.{name}]: names ngram-N are reserved for prompt-lookup drafts")
        tokenizers = {
            name: _parse_tokenizer(name, e, base, models) for name, e in (data.get("tokenizers") or {}).items()
        }
        for name, tok in tokenizers.items():
            if tok.model is not None and models[tok.model].engine is not None:
                raise RegistryError(f"[tokenizers.{name}]: model {tok.model!r} is on engine "
                                    f"{models[tok.model].engine}, so its tokenizer files are not here; give path")
        return cls(models, tokenizers, source, engines)

    @classmethod
    def from_toml(cls, path: Path | str) -> Registry:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RegistryError(
                f"registry file {path} not found; create it or point {CONFIG_ENV} at one"
            ) from None
        except OSError as e:
            raise RegistryError(f"registry file {path} can't be read: {e.strerror or e}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            reason = " ".join(str(e).split())
            raise RegistryError(f"registry file {path} is not valid TOML: {reason}") from None
        try:
            return cls.from_dict(data, base_dir=path.resolve().parent, source=path)
        except RegistryError as exc:  # a table's error ("[engines.x]: ...") names the file it is in, too
            if str(exc).startswith(str(path)):
                raise
            raise RegistryError(f"{path}: {exc}") from None

    @classmethod
    def load(cls, path: Path | str | None = None) -> Registry:
        """The registry at `path`, else $SPECDEC_CONFIG, else ./specdec.toml, else the repo's specdec.toml."""
        return cls.from_toml(default_config_path() if path is None else path)

    # --- names -----------------------------------------------------------------------------------

    @property
    def model_names(self) -> list[str]:
        return sorted(self.models)

    @property
    def tokenizer_names(self) -> list[str]:
        return sorted(self.tokenizers)

    def knows(self, name: str | None, kind: str = "model") -> bool:
        """Whether `name` resolves, without loading anything. kind: model, draft or tokenizer."""
        if name is None:
            return kind == "draft"
        if kind == "tokenizer":
            return name in self.tokenizers
        if kind == "draft":
            return name == "none" or ngram_size(name) is not None or name in self.models
        if kind == "model":
            return name in self.models
        raise ValueError(f"kind: expected model, draft or tokenizer, got {kind!r}")

    def unknown_names(self, req: Any) -> dict[str, str]:
        """The request fields (log names) whose values the registry can't resolve: {field: value}."""
        out: dict[str, str] = {}
        if not self.knows(req.target_model, "model"):
            out["target_model"] = req.target_model
        if not self.knows(req.speculation, "draft"):
            out["draft_model"] = req.speculation
        if not self.knows(req.tokenizer_version, "tokenizer"):
            out["tokenizer_version"] = req.tokenizer_version
        return out

    def is_available(self, name: str) -> bool:
        """Whether a model or tokenizer's files are on disk (ngram drafts always are)."""
        if ngram_size(name) is not None:
            return True
        if name in self.models:
            return self.models[name].is_available()
        if name in self.tokenizers:
            tok = self.tokenizers[name]
            if tok.model is not None:
                return self.models[tok.model].engine is None and self.models[tok.model].is_available()
            if tok.gguf is not None:
                return tok.gguf.is_file()
            return tok.path is None or tok.path.is_dir()
        return False

    def engine_of(self, model_name: str | None) -> EngineSpec | None:
        """The engine a model replays on, or None for a model this process loads."""
        spec = self.models.get(model_name) if model_name is not None else None
        return self.engines[spec.engine] if spec is not None and spec.engine is not None else None

    def model(self, name: str, kind: str = "model") -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise UnknownModelError(name, kind, self.model_names, self.source) from None

    def tokenizer(self, name: str) -> TokenizerSpec:
        try:
            return self.tokenizers[name]
        except KeyError:
            raise UnknownModelError(name, "tokenizer", self.tokenizer_names, self.source) from None

    def tokenizer_source(self, name: str) -> tuple[str, dict[str, Any]]:
        """(name_or_path, kwargs) for AutoTokenizer.from_pretrained."""
        tok = self.tokenizer(name)
        if tok.model is not None:
            return self.model(tok.model).from_pretrained_args()
        if tok.gguf is not None:
            return ModelSpec(name, gguf=tok.gguf).from_pretrained_args()
        if tok.path is not None:
            return ModelSpec(name, path=tok.path).from_pretrained_args()
        return str(tok.hub_id), {"revision": tok.revision} if tok.revision else {}


