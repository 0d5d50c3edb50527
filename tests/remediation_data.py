"""A store's log with known contamination and a key fix, shared by the remediation tests and the dashboard's
Remediate section tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from helpers import rec

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def incident() -> list[dict]:
    """prod: key a served another identity at 10:02, key b at 10:01:30 (so b comes first), key c was shared by
    two identities without a hit, key d only ever by its own; padding keys make the old scheme a scheme. From
    10:20 prod's keys take a new scheme, yet d is hit under the old one twice after that. edge changes scheme
    at 10:10 cleanly."""
    old, new = "svc-v1:prompt:", "svc-v2:full:"
    records = [
        rec("a0", ts=at(0), cache_key=old + "a"),
        rec("b0", ts=at(1), cache_key=old + "b", prompt="B"),
        rec("b1", ts=at(1.5), cache_key=old + "b", prompt="B", cache_hit=True, temperature=0.7),
        rec("a1", ts=at(2), cache_key=old + "a", cache_hit=True, max_tokens=16),
        rec("a2", ts=at(3), cache_key=old + "a", cache_hit=True),
        rec("a3", ts=at(6), cache_key=old + "a", cache_hit=True, tokenizer_version="tok-v2"),
        rec("c0", ts=at(4), cache_key=old + "c", prompt="C"),
        rec("c1", ts=at(5), cache_key=old + "c", prompt="C", max_tokens=32),
        rec("d0", ts=at(5.5), cache_key=old + "d", prompt="D"),
        rec("d1", ts=at(7), cache_key=old + "d", prompt="D", cache_hit=True),
        rec("d2", ts=at(21), cache_key=old + "d", prompt="D", cache_hit=True),
        rec("d3", ts=at(22), cache_key=old + "d", prompt="D", cache_hit=True),
    ]
    records += [rec(f"u{n}", ts=at(8 + n / 10), cache_key=f"{old}u{n}", prompt=f"U{n}") for n in range(6)]
    records += [rec(f"n{n}", ts=at(20 + n / 10), cache_key=f"{new}{n}", prompt=f"N{n}") for n in range(12)]
    records += [rec(f"e{n}", ts=at(n), deployment="edge", cache_key=f"e-v1:x:{n}", prompt=f"E{n}")
                for n in range(10)]
    records += [rec(f"f{n}", ts=at(10 + n), deployment="edge", cache_key=f"e-v2:y:{n}", prompt=f"F{n}")
                for n in range(10)]
    return records
