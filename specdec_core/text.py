"""Text from a log, an engine or a store, written to a terminal as the characters it holds, or read as a number."""

from __future__ import annotations

from typing import Any


def ascii_digits(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits. str.isdigit() also takes '²', which int() refuses, and
    other scripts' digits ('٣'), which int() reads as 3: a log's or a user's text with either is no number."""
    return text.isascii() and text.isdigit()


def host_and_port(text: str) -> tuple[str, int] | None:
    """HOST:PORT ("[::1]:9464" for IPv6) as the host without its brackets and a port from 0 (any free one) to
    65535; None where it is not one."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not ascii_digits(port) or int(port) > 65535:
        return None
    return host, int(port)


def escape_controls(text: Any) -> str:
    """Text with every control or other unprintable character written as its escape (\\x1b, \\r, \\n, \\u202e):
    what a log or an engine says can't clear a terminal, retitle it, make a link or overwrite a line."""
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))


def escape_lines(text: str) -> str:
    """Text of several lines (a CSV) for a terminal: each line's control characters escaped (escape_controls),
    its line breaks, LF or CRLF, kept as breaks."""
    return "\n".join(escape_controls(line.removesuffix("\r")) for line in text.split("\n"))
