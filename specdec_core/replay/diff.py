"""How a replayed output differs from what production returned: prefix, first divergence, word diff."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_WORDS = re.compile(r"\S+|\s+")


@dataclass(frozen=True)
class WordOp:
    op: str  # equal, replace, delete (only in production), insert (only in the replay)
    production: str
    replay: str


@dataclass(frozen=True)
class OutputDiff:
    identical: bool
    production_tokens: int
    replay_tokens: int
    common_prefix_tokens: int
    common_prefix_chars: int
    first_divergent_token: int | None  # index into the output tokens; None when identical
    first_divergent_char: int | None
    similarity: float  # difflib ratio over words, 1.0 for identical outputs
    word_ops: tuple[WordOp, ...]
    max_tokens: int

    @property
    def production_over_max(self) -> bool:
        return self.production_tokens > self.max_tokens

    @property
    def replay_over_max(self) -> bool:
        return self.replay_tokens > self.max_tokens

    def to_json(self) -> dict:
        return {
            "identical": self.identical,
            "production_tokens": self.production_tokens,
            "replay_tokens": self.replay_tokens,
            "common_prefix_tokens": self.common_prefix_tokens,
            "common_prefix_chars": self.common_prefix_chars,
            "first_divergent_token": self.first_divergent_token,
            "first_divergent_char": self.first_divergent_char,
            "similarity": self.similarity,
            "max_tokens": self.max_tokens,
            "production_over_max": self.production_over_max,
            "word_ops": [[w.op, w.production, w.replay] for w in self.word_ops],
        }

    def render(self) -> str:
        """A terminal-readable diff: [-production-]{+replay+} around what changed."""
        parts = []
        for w in self.word_ops:
            if w.op == "equal":
                parts.append(w.production)
            else:
                if w.production:
                    parts.append(f"[-{w.production}-]")
                if w.replay:
                    parts.append(f"{{+{w.replay}+}}")
        return "".join(parts)


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def diff_outputs(production_text: str, production_ids: Sequence[int], replay_text: str,
                 replay_ids: Sequence[int], max_tokens: int) -> OutputDiff:
    identical = production_text == replay_text
    prefix_tokens = _common_prefix(production_ids, replay_ids)
    prefix_chars = _common_prefix(production_text, replay_text)
    prod_words = _WORDS.findall(production_text)
    replay_words = _WORDS.findall(replay_text)
    matcher = difflib.SequenceMatcher(a=prod_words, b=replay_words, autojunk=False)
    ops = tuple(
        WordOp(op, "".join(prod_words[i1:i2]), "".join(replay_words[j1:j2]))
        for op, i1, i2, j1, j2 in matcher.get_opcodes()
    )
    return OutputDiff(
        identical=identical,
        production_tokens=len(production_ids),
        replay_tokens=len(replay_ids),
        common_prefix_tokens=prefix_tokens,
        common_prefix_chars=prefix_chars,
        first_divergent_token=None if identical else prefix_tokens,
        first_divergent_char=None if identical else prefix_chars,
        similarity=1.0 if identical else round(matcher.ratio(), 6),
        word_ops=ops,
        max_tokens=max_tokens,
    )


def word_diff(production_text: str, other_text: str) -> tuple[tuple[WordOp, ...], float]:
    """Production's words against another text's (a stored replay, the source's replay), and their similarity.

    Token-level numbers need the token ids, which a stored replay of the source does not keep; the
    words are what a reader compares anyway.
    """
    prod_words = _WORDS.findall(production_text)
    other_words = _WORDS.findall(other_text)
    matcher = difflib.SequenceMatcher(a=prod_words, b=other_words, autojunk=False)
    ops = tuple(WordOp(op, "".join(prod_words[i1:i2]), "".join(other_words[j1:j2]))
                for op, i1, i2, j1, j2 in matcher.get_opcodes())
    return ops, 1.0 if production_text == other_text else round(matcher.ratio(), 6)
