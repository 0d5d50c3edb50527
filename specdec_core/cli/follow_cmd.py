"""`specdec ingest --follow`: a thin loop over store.follow.Follower that prints one line per batch."""

from __future__ import annotations

import argparse
import sys

from specdec_core.store.connection import Store, StoreError
from specdec_core.store.follow import BATCH_ROWS, FollowBatch, Follower


def _say(batch: FollowBatch) -> None:
    r = batch.result
    lag = "n/a" if batch.lag_s is None else f"{batch.lag_s:.1f}s"
    newest = "none" if batch.newest is None else batch.newest.isoformat()
    print(f"batch {r.ingest_id}: rows {r.read} (accepted {r.accepted}, duplicates {r.duplicates}, "
          f"quarantined {r.quarantined}), newest {newest}, lag {lag}", flush=True)


def cmd_follow(args: argparse.Namespace) -> int:
    try:
        follower = Follower(Store(args.db), args.paths, batch_rows=args.batch_rows or BATCH_ROWS, on_batch=_say)
        print(f"following {', '.join(args.paths)} into {follower.store.path} (Ctrl-C stops)", file=sys.stderr)
        follower.run()
    except StoreError as exc:
        print(f"specdec ingest: {exc}", file=sys.stderr)
        return 1
    return 0
