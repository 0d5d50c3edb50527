"""Text from a log, an engine or a store, written to a terminal as the characters it holds."""

from __future__ import annotations

from typing import Any


def escape_controls(text: Any) -> str:
    """Text with every control or other unprintable character written as its escape (\\x1b, \\r, \\n, \\u202e):
    what a log or an engine says can't clear a terminal, retitle it, make a link or overwrite a line."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))
