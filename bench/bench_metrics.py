"""Every dashboard query on a 1M-row database (or any store: --db), beside the same question answered with pandas.

Targets: each of ours under 0.5 s; at least 5x faster than pandas. pandas gets the rows
already in memory (its load time is printed apart and not counted against it).

    .venv/bin/python bench/bench_metrics.py [--rows 1000000] [--db bench/out/append-base-5000000.duckdb]
    .venv/bin/python bench/bench_metrics.py --db ducklake:bench/out/append-base-5000000.lake/s.sqlite
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent
sys.path.insert(0, str(ROOT))

from common import median_seconds  # noqa: E402

from specdec_core import analysis  # noqa: E402
from specdec_core.demo.synthetic import make_synthetic_log  # noqa: E402
from specdec_core.ingestion.load import ingest  # noqa: E402
from specdec_core.store.connection import Store  # noqa: E402


def draft_label(df: pd.DataFrame) -> pd.Series:
    return df["draft_model"].fillna("none").replace({"none": "none"})


# --- the same questions in pandas ---------------------------------------------------------------------------


def pd_hit_rate_by_combination(df: pd.DataFrame) -> pd.DataFrame:
    return (df.assign(draft=draft_label(df)).groupby(["target_model", "draft"])["cache_hit"]
            .agg(["size", "sum", "mean"]))


def pd_contaminated_hits(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(dep=df["deployment"].fillna("\0"))
    hits = d[d["cache_hit"]].sort_values("ts")
    misses = d[~d["cache_hit"]].sort_values("ts")
    joined = pd.merge_asof(hits, misses[["ts", "dep", "cache_key", "request_id", "fingerprint"]], on="ts",
                           by=["dep", "cache_key"], suffixes=("", "_source"), direction="backward")
    return joined[joined["fingerprint_source"].notna() & (joined["fingerprint_source"] != joined["fingerprint"])]


def pd_headline(df: pd.DataFrame) -> dict:
    contaminated = pd_contaminated_hits(df)
    keys = df.groupby(["deployment", "cache_key"])["fingerprint"].nunique()
    return {"requests": len(df), "hit_rate": df["cache_hit"].mean(), "contaminated": len(contaminated),
            "violations": int((df["output_tokens"] > df["max_tokens"]).sum()), "collisions": int((keys > 1).sum()),
            "unique_keys": df.groupby("deployment")["cache_key"].nunique().sum()}


def pd_output_length(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby("max_tokens")["output_tokens"]
    return pd.concat([g.min(), g.quantile(0.25), g.median(), g.quantile(0.75), g.max(),
                      (df["output_tokens"] > df["max_tokens"]).groupby(df["max_tokens"]).sum()], axis=1)


def pd_key_collisions(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby(["deployment", "cache_key"]).agg(identities=("fingerprint", "nunique"),
                                                    requests=("request_id", "size"), first=("ts", "min"),
                                                    last=("ts", "max"))
    return g[g["identities"] > 1].sort_values("identities", ascending=False)


def pd_key_ratio(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("deployment").agg(keys=("cache_key", "nunique"), ids=("fingerprint", "nunique"),
                                        hit_rate=("cache_hit", "mean"), n=("request_id", "size"))


def pd_acceptance(df: pd.DataFrame) -> pd.DataFrame:
    d = df[~df["cache_hit"] & (df["draft_tokens"] > 0)]
    return d.assign(draft=draft_label(d)).groupby(["target_model", "draft"])[["draft_tokens", "accepted_tokens"]].sum()


def pd_latency(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby("cache_hit")["latency_ms"].describe(percentiles=[0.5, 0.95])


def pd_mismatch_over_time(df: pd.DataFrame) -> pd.DataFrame:
    contaminated = set(pd_contaminated_hits(df)["request_id"])
    d = df.assign(bad=df["request_id"].isin(contaminated))
    return d.groupby([pd.Grouper(key="ts", freq="5min"), "deployment"])["bad"].agg(["sum", "size"])


def pd_hit_rate_over_time(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(combo=df["target_model"] + " / " + draft_label(df))
    return d.groupby([pd.Grouper(key="ts", freq="5min"), "combo"])["cache_hit"].mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--db", help="ask an existing store instead (e.g. one bench_append.py built; a lake: "
                                      "ducklake:bench/out/append-base-1000000.lake/s.sqlite)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    db = args.db or str(OUT / f"metrics-{args.rows}.duckdb")
    store = Store(db)
    if not store.exists:  # one written by an older version is brought up to date by its first read
        log = OUT / f"synthetic-{args.rows}.jsonl"
        if not log.exists():
            make_synthetic_log(log, args.rows)
        ingest(store, [str(log)])
    t = time.perf_counter()
    with store.read() as con:
        df = con.execute("SELECT request_id, ts, deployment, target_model, draft_model, cache_key, cache_hit, "
                         "fingerprint, max_tokens, output_tokens, latency_ms, draft_tokens, accepted_tokens "
                         "FROM requests").df()
    print(f"{len(df):,} rows; pandas load time (not counted): {time.perf_counter() - t:.1f} s\n")
    lo, hi = df["ts"].min(), df["ts"].max()
    # A window that cuts through minutes at both ends: summaries plus the edge rows, or rows alone.
    window = analysis.Filters(start=(lo + (hi - lo) * 0.25).to_pydatetime(), end=(lo + (hi - lo) * 0.75).to_pydatetime())
    inside = df[(df["ts"] >= window.start) & (df["ts"] <= window.end)]
    for title, f, frame in (("whole log (the dashboard's default view)", analysis.NO_FILTERS, df),
                            (f"time range {window.start:%H:%M:%S.%f} to {window.end:%H:%M:%S.%f}", window, inside)):
        print(f"{title}: {len(frame):,} rows")
        run_cases(store, f, frame)
        print(f"{'red flags (all six checks)':32}{median_seconds(lambda f=f: analysis.red_flags(store, f)):>9.3f}\n")


def run_cases(store: Store, f: analysis.Filters, df: pd.DataFrame) -> None:
    cases = [
        ("headline numbers", lambda: analysis.headline(store, f), lambda: pd_headline(df)),
        ("hit rate by combination", lambda: analysis.hit_rate_by_combination(store, f),
         lambda: pd_hit_rate_by_combination(df)),
        ("hit rate over time", lambda: analysis.hit_rate_over_time(store, f, "5 minutes"),
         lambda: pd_hit_rate_over_time(df)),
        ("output length by max_tokens", lambda: analysis.output_length_by_max_tokens(store, f),
         lambda: pd_output_length(df)),
        ("contaminated hits", lambda: analysis.contaminated_hits(store, f), lambda: pd_contaminated_hits(df)),
        ("mismatch rate over time", lambda: analysis.mismatch_rate_over_time(store, f, "5 minutes"),
         lambda: pd_mismatch_over_time(df)),
        ("key collisions", lambda: analysis.key_collisions(store, f), lambda: pd_key_collisions(df)),
        ("keys per identity", lambda: analysis.key_ratio_by_deployment(store, f), lambda: pd_key_ratio(df)),
        ("acceptance by combination", lambda: analysis.acceptance_by_combination(store, f),
         lambda: pd_acceptance(df)),
        ("latency hit vs miss", lambda: analysis.latency_hit_vs_miss(store, f), lambda: pd_latency(df)),
    ]
    print(f"{'question':32}{'ours s':>9}{'pandas s':>10}{'speedup':>9}  target (<0.5 s, >=5x)")
    met = 0
    for name, ours, theirs in cases:
        a, b = median_seconds(ours), median_seconds(theirs)
        ok = a < 0.5 and b / a >= 5
        met += ok
        print(f"{name:32}{a:>9.3f}{b:>10.3f}{b / a:>8.1f}x  {'met' if ok else 'NOT met'}")
    print(f"{met} of {len(cases)} met")

if __name__ == "__main__":
    main()
