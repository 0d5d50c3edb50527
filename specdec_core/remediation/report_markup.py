"""The incident report's two markups: how a value from the log is written into Markdown and into HTML so that
it shows as the text it is. A deployment, consumer, request id or key prefix is whatever a log said: in
Markdown, `<img onerror=...>` is HTML that many viewers render, `[x](javascript:...)` is a link, a backtick
ends a code span and a line break ends a list item or a table row.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Inline:
    """How the shared sentences write what they quote: `text`, a value in running text; `code`, a name shown
    as code (a field, a key prefix, a command)."""

    text: Callable[[Any], str]
    code: Callable[[Any], str]


class Markup(str):
    """A table cell already written in its markup (a link built from escaped text): the table keeps it as is."""


# What lets a value become markup: a link or an image (brackets), a code span, a table's next cell, an escape.
# Emphasis characters are left as they are: `model_prompt` stays greppable, and `*` can only restyle text.
_MD_PUNCTUATION = re.compile(r"([\\`\[\]|])")


def md_text(value: Any) -> str:
    """A value as Markdown text: HTML characters as entities; brackets, backticks, pipes and backslashes
    backslash-escaped; line breaks as spaces."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCTUATION.sub(r"\\\1", text).replace("\r", " ").replace("\n", " ")


def md_code(value: Any) -> str:
    """A value as a Markdown code span, its fence longer than any run of backticks inside it."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def esc(value: Any) -> str:
    return html.escape(str(value))


MARKDOWN = Inline(md_text, md_code)
HTML = Inline(esc, lambda value: f"<code>{esc(value)}</code>")
PLAIN = Inline(str, lambda value: f"`{value}`")  # the sentences as text, for a reader that is neither


def md_cell(value: Any) -> str:
    return value if isinstance(value, Markup) else md_text(value)


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return out


def md_link(text: str, url: str | None) -> Markup:
    """A link whose text is a value from the log; the URL is ours (the dashboard's address)."""
    return Markup(f"[{md_text(text)}]({url})" if url else md_text(text))


def h_table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table of cells already written in HTML."""
    head = "".join(f"<th>{esc(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def h_link(text: str, url: str | None) -> str:
    return f'<a href="{esc(url)}">{esc(text)}</a>' if url else esc(text)


def escaped(rows: list[list[Any]]) -> list[list[str]]:
    return [[esc(c) for c in row] for row in rows]
