"""Which source a hit is credited to when hundreds of requests share a cache key and a millisecond.

Real traffic logs milliseconds: on a hot key, hundreds of hits and several misses (entries expiring)
share one instant. The contract (shared/log-schema.md, "Contamination"): a hit's source is the latest
earlier miss of its deployment and key; a miss at the hit's instant counts as earlier, and of several
misses at one instant the one logged last (file, then line) wrote the entry. A hit is the first sight of
its identity when no request of its deployment had that identity earlier (one at the same instant is not
earlier). The judging's speed-ups (derived/hit_sources.py) must keep every one of these verdicts: they are
checked here against a plain-Python reading of the rules, for one ingest and for the files ingested
one at a time in either order.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import duckdb
from helpers import instant, rec, write_jsonl

from specdec_core.contract.identity import fingerprint, identity
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store, release_snapshots

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)
# Identities that differ in the draft (greedy: the draft stays in the identity) or in max_tokens.
KINDS = {"A": {"draft_model": "d1"}, "B": {"draft_model": "d2"}, "C": {"max_tokens": 16},
         "D": {"max_tokens": 32}}


def _spell(ms: int, rng: random.Random) -> object:
    """One instant, spelled as epoch milliseconds or as RFC 3339 in UTC or at +02:00."""
    at = T0 + timedelta(milliseconds=ms)
    style = rng.randrange(3)
    if style == 0:
        return int(at.timestamp() * 1000)
    zone = timezone.utc if style == 1 else timezone(timedelta(hours=2))
    text = at.astimezone(zone).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}"
    return text + ("Z" if style == 1 else "+02:00")


def _tied_log(rng: random.Random) -> dict[str, list[dict]]:
    """Two files of one hot key in three deployments: 300 hits at each of three consecutive milliseconds,
    misses tied with hits and with each other, the same key in another deployment at the same instants."""
    rows: dict[str, list[dict]] = {"a": [], "b": []}
    n = 0

    def add(file: str, ms: int, deployment: str | None, kind: str, hit: bool) -> None:
        nonlocal n
        n += 1
        rows[file].append(rec(f"{'h' if hit else 'm'}{n:05d}", ts=_spell(ms, rng), deployment=deployment,
                              cache_key="hot", cache_hit=hit, **KINDS[kind]))

    for deployment in ("prod", "canary", None):
        # 0 ms: hits before any miss of the key; their identities' first sights.
        for _ in range(300):
            add(rng.choice("ab"), 0, deployment, rng.choice("AB"), True)
        # 1 ms: misses of A and B in both files among 300 hits (C and D new here, D with a miss at this instant).
        misses = [("a", "A"), ("a", "B"), ("b", "A"), ("b", "B")] if deployment == "prod" else [("a", "B"), ("b", "A")]
        for file, kind in misses:
            add(file, 1, deployment, kind, False)
        add("b", 1, deployment, "D", False)
        for _ in range(300):
            add(rng.choice("ab"), 1, deployment, rng.choice("ABCD"), True)
        # 2 ms: only hits, served by the entry the last miss of 1 ms wrote.
        for _ in range(300):
            add(rng.choice("ab"), 2, deployment, rng.choice("ABC"), True)
    for file_rows in rows.values():
        rng.shuffle(file_rows)
    return rows


def _reference(files: dict[str, list[dict]]) -> dict[str, tuple[str | None, bool, bool]]:
    """request_id -> (source, contaminated, first sight) of every hit, one record at a time."""
    rows = [(instant(r["ts"]), name, line, r) for name, recs in sorted(files.items())
            for line, r in enumerate(recs, start=1)]
    ids = {r["request_id"]: identity(r) for _, _, _, r in rows}
    first: dict[tuple, datetime] = {}
    misses: dict[tuple, list] = {}
    for at, name, line, r in rows:
        key = (r["deployment"], fingerprint(r))
        first[key] = min(first.get(key, at), at)
        if not r["cache_hit"]:
            misses.setdefault((r["deployment"], r["cache_key"]), []).append((at, name, line, r["request_id"]))
    verdicts = {}
    for at, _, _, r in rows:
        if not r["cache_hit"]:
            continue
        earlier = [m for m in misses.get((r["deployment"], r["cache_key"]), []) if m[0] <= at]
        source = max(earlier)[3] if earlier else None
        verdicts[r["request_id"]] = (source, source is not None and ids[source] != ids[r["request_id"]],
                                     at <= first[(r["deployment"], fingerprint(r))])
    return verdicts


def _verdicts(db) -> dict[str, tuple[str | None, bool, bool]]:
    release_snapshots()
    with duckdb.connect(str(db), read_only=True) as con:
        return {rid: (src, bool(bad), bool(first)) for rid, src, bad, first in con.execute(
            "SELECT request_id, source_request_id, contaminated, first_sight FROM hit_sources").fetchall()}


def test_hundreds_of_hits_at_one_millisecond_are_credited_to_the_miss_logged_last(tmp_path):
    files = _tied_log(random.Random(1))
    paths = {name: write_jsonl(tmp_path / f"{name}.jsonl", recs) for name, recs in files.items()}
    expected = _reference(files)
    # The log is the hard one it means to be: of the misses tied at 1 ms, b's last line is every later hit's
    # source (one per deployment), whatever a's lines hold; hundreds of hits are contaminated, hundreds first sights.
    assert len({v[0] for v in expected.values() if v[0] is not None}) == 3
    assert sum(v[1] for v in expected.values()) > 300 and sum(v[2] for v in expected.values()) > 300

    together = tmp_path / "together.duckdb"
    assert ingest(Store(together), [str(p) for p in paths.values()]).accepted == sum(map(len, files.values()))
    assert _verdicts(together) == expected
    # Batch by batch, in either order, the later file's misses move the sources of stored hits.
    for order in (("a", "b"), ("b", "a")):
        db = tmp_path / f"{''.join(order)}.duckdb"
        for name in order:
            ingest(Store(db), [str(paths[name])])
        assert _verdicts(db) == expected, order
