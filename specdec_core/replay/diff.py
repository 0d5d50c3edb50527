"""How a replayed output differs from what production returned: prefix, first divergence, word diff."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_WORDS = re.compile(r"\S+|\s+")
# difflib's matching is quadratic in the words: past this many on either side the rest is one change, shown cut.
MAX_DIFF_WORDS = 4000
# What the diff shows of the words it did not compare.
REST_CHARS = 400


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
    ops, ratio = _word_ops(production_text, replay_text)
    return OutputDiff(
        identical=identical,
        production_tokens=len(production_ids),
        replay_tokens=len(replay_ids),
        common_prefix_tokens=prefix_tokens,
        common_prefix_chars=prefix_chars,
        first_divergent_token=None if identical else prefix_tokens,
        first_divergent_char=None if identical else prefix_chars,
        similarity=1.0 if identical else ratio,
        word_ops=ops,
        max_tokens=max_tokens,
    )


def word_diff(production_text: str, other_text: str) -> tuple[tuple[WordOp, ...], float]:
    """Production's words against another text's (a stored replay, the source's replay), and their similarity.

    Token-level numbers need the token ids, which a stored replay of the source does not keep; the
    words are what a reader compares anyway.
    """
    if production_text == other_text:
        return _word_ops(production_text, other_text)[0], 1.0
    return _word_ops(production_text, other_text)


def _words(text: str) -> tuple[list[str], str]:
    """The first MAX_DIFF_WORDS words of a text, and the rest as one string (cut to REST_CHARS)."""
    words: list[str] = []
    for match in _WORDS.finditer(text):
        if len(words) == MAX_DIFF_WORDS:
            rest = text[match.start():]
            more = len(rest) - REST_CHARS
            return words, rest[:REST_CHARS] + (f"… ({more:,} more characters not compared)" if more > 0 else "")
        words.append(match.group())
    return words, ""


def _word_ops(a_text: str, b_text: str) -> tuple[tuple[WordOp, ...], float]:
    """Word operations from one text to the other and their similarity, over at most MAX_DIFF_WORDS a side."""
    a, a_rest = _words(a_text)
    b, b_rest = _words(b_text)
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    ops = [WordOp(op, "".join(a[i1:i2]), "".join(b[j1:j2])) for op, i1, i2, j1, j2 in matcher.get_opcodes()]
    if a_rest or b_rest:
        kind = "equal" if a_rest == b_rest else "replace" if a_rest and b_rest else "delete" if a_rest else "insert"
        ops.append(WordOp(kind, a_rest, b_rest))
    return tuple(ops), round(matcher.ratio(), 6)
