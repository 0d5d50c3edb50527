"""A large synthetic incident log for benchmarks, written by DuckDB: no model involved.

The workload mirrors the demo: weighted experiment configurations, a prompt pool with
hot and cold prompts, consumers (API keys, a few busy ones and a long tail), an A/B test of the draft
model on the busiest configuration, three deployments of which two use a narrow cache key until a
fix is rolled out. Hits copy the output of the latest miss on the same key, exactly as
a cache would, so contamination and length violations arise from the keys, not by
decree.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import duckdb

# target, draft, speculative tokens, temperature, top_p, max_tokens, seed, stop (JSON), tokenizer, weight
CONFIGS: tuple[tuple, ...] = (
    ("smollm2-135m", "smollm2-135m-draft", 4, 0.0, 1.0, 64, None, None, "tok-v1", 30),
    ("smollm2-135m", "ngram-3", 4, 0.0, 1.0, 64, None, None, "tok-v1", 15),
    ("smollm2-135m", "smollm2-135m-draft", 4, 0.7, 0.95, 128, 7, None, "tok-v1", 15),
    ("smollm2-135m", "none", None, 0.7, 0.95, 128, 7, None, "tok-v2", 10),
    ("smollm2-135m", "smollm2-135m-draft", 2, 0.0, 1.0, 16, None, '["\\n\\n"]', "tok-v1", 10),
    ("smollm2-135m", "ngram-3", 4, 1.0, 0.9, 32, 42, '["."]', "tok-v2", 10),
    ("llama-8b", "llama-1b", 5, 0.0, 1.0, 256, None, None, "llama-tok-3", 5),
    ("llama-8b", "llama-1b", 5, 0.9, 0.9, 256, None, None, "llama-tok-3", 5),
)
DEPLOYMENTS = (("edge-a", "prompt_only"), ("edge-b", "model_prompt"), ("core", "full"))


def make_synthetic_log(path: str | Path, rows: int, *, seed: int = 1, prompts: int = 5000,
                       start: datetime = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc),
                       hours: float = 8.0, fix_at_fraction: float = 0.6, consumers: int = 200) -> Path:
    """Write `rows` contract-format records as JSON Lines (gzipped when the name ends in .gz)."""
    # Long because it is one SQL statement that writes the whole log in DuckDB; split, its parts would only be read together.
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("CREATE TEMP TABLE configs (cid INT, target_model VARCHAR, draft_model VARCHAR, "
                    "num_speculative_tokens INT, temperature DOUBLE, top_p DOUBLE, max_tokens INT, seed BIGINT, "
                    "stop VARCHAR, tokenizer_version VARCHAR, weight INT)")
        con.executemany("INSERT INTO configs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(i, *c) for i, c in enumerate(CONFIGS)])
        con.execute("""
            CREATE TEMP TABLE config_cdf AS
            SELECT *, sum(weight) OVER (ORDER BY cid) - weight AS lo, sum(weight) OVER (ORDER BY cid) AS hi,
                   sum(weight) OVER () AS total FROM configs
        """)
        span_ms = int(hours * 3600 * 1000)
        fix_ms = int(span_ms * fix_at_fraction)
        params = {"n": rows, "seed": seed, "prompts": prompts, "span": span_ms, "fix": fix_ms, "consumers": consumers,
                  "t0": int(start.timestamp() * 1000)}
        con.execute("""
            CREATE TEMP TABLE base AS
            -- DuckDB's hash function, not Python's: the same in every process (it may change with DuckDB's version,
            -- which only changes which synthetic log a seed gives).
            WITH g AS (
                SELECT i,
                       (hash(i, $seed, 1) % 1000000) / 1000000.0 AS u_prompt,  -- # hash-ok
                       hash(i, $seed, 2) % 100 AS u_config,  -- # hash-ok
                       hash(i, $seed, 3) % 3 AS u_dep,  -- # hash-ok
                       hash(i, $seed, 4) % 1000 AS u_len,  -- # hash-ok
                       hash(i, $seed, 5) % 100 AS u_ttl,  -- # hash-ok
                       (hash(i, $seed, 7) % 1000000) / 1000000.0 AS u_consumer,  -- # hash-ok
                       $t0 + (i * $span) // $n + hash(i, $seed, 6) % 1000 AS ts_ms  -- # hash-ok
                FROM range($n) t(i)
            )
            SELECT g.i, g.ts_ms, g.u_len, g.u_ttl,
                   -- Who receives the output: a few busy API keys and a long tail; one request in a hundred unnamed.
                   CASE WHEN g.u_consumer >= 0.01 THEN 'key-' || floor(pow(g.u_consumer, 2) * $consumers)::INT
                   END AS consumer,
                   -- A power law over the pool: a few hot prompts take most of the traffic.
                   'prompt ' || floor(pow(g.u_prompt, 3) * $prompts)::INT AS prompt,
                   c.*, d.deployment, d.scheme,
                   CASE WHEN g.ts_ms - $t0 >= $fix THEN 'full' ELSE d.scheme END AS key_in_use
            FROM g
            JOIN config_cdf c ON (g.u_config * c.total) // 100 >= c.lo AND (g.u_config * c.total) // 100 < c.hi
            JOIN (SELECT * FROM (VALUES (0, 'edge-a', 'prompt_only'), (1, 'edge-b', 'model_prompt'),
                                        (2, 'core', 'full')) v(k, deployment, scheme)) d ON d.k = g.u_dep
        """, params)
        con.execute("""
            CREATE TEMP TABLE keyed AS
            SELECT *,
                   md5(prompt || cid::VARCHAR) AS identity_tag,
                   deployment || ':' || CASE key_in_use
                       WHEN 'prompt_only' THEN 'p:' || md5(prompt)
                       WHEN 'model_prompt' THEN 'mp:' || md5(target_model || prompt)
                       ELSE 'full:v1:' || md5(prompt || cid::VARCHAR) END AS cache_key
            FROM base
        """)
        con.execute("""
            CREATE TEMP TABLE served AS
            WITH w AS (
                SELECT *, row_number() OVER (PARTITION BY deployment, cache_key ORDER BY ts_ms, i) AS nth
                FROM keyed
            ), m AS (
                SELECT *, NOT (nth = 1 OR u_ttl < 3) AS cache_hit,
                       least(max_tokens, 4 + u_len % max_tokens) AS own_tokens
                FROM w
            )
            SELECT *,
                   last_value(CASE WHEN NOT cache_hit THEN identity_tag END IGNORE NULLS)
                       OVER (PARTITION BY deployment, cache_key ORDER BY ts_ms, i) AS served_tag,
                   last_value(CASE WHEN NOT cache_hit THEN own_tokens END IGNORE NULLS)
                       OVER (PARTITION BY deployment, cache_key ORDER BY ts_ms, i) AS served_tokens
            FROM m
        """)
        compression = ", COMPRESSION gzip" if path.name.endswith(".gz") else ""
        con.execute(f"""
            COPY (
                SELECT 'syn-' || lpad(i::VARCHAR, 8, '0') AS request_id,
                       strftime(make_timestamp((ts_ms * 1000)::BIGINT), '%Y-%m-%dT%H:%M:%S.%gZ') AS ts,
                       prompt, target_model, draft_model, num_speculative_tokens, temperature, top_p,
                       CAST(NULL AS INT) AS top_k, max_tokens, seed, stop::JSON AS stop, tokenizer_version,
                       deployment, cache_key, cache_hit, CAST(NULL AS JSON) AS cached_fingerprint,
                       'output of ' || served_tag || repeat(' tok', served_tokens::INT) AS output_text,
                       served_tokens AS output_tokens,
                       CASE WHEN served_tokens >= max_tokens THEN 'length' ELSE 'stop' END AS finish_reason,
                       round(CASE WHEN cache_hit THEN 2 + u_len % 5 ELSE 40 + served_tokens * 3.5 END, 1)
                           AS latency_ms,
                       CASE WHEN NOT cache_hit AND draft_model <> 'none' THEN own_tokens + own_tokens // 2 END
                           AS draft_tokens,
                       CASE WHEN NOT cache_hit AND draft_model <> 'none' THEN own_tokens - own_tokens // 4 END
                           AS accepted_tokens,
                       consumer,
                       -- An A/B test of the draft on the busiest configuration: a model draft against n-grams.
                       CASE cid WHEN 0 THEN 'arm-a' WHEN 1 THEN 'arm-b' END AS experiment
                FROM served ORDER BY ts_ms, i
            ) TO '{_sql_path(path)}' (FORMAT json{compression})
        """)
    finally:
        con.close()
    return path


def _sql_path(path: Path) -> str:
    text = str(path)
    if "'" in text:
        raise ValueError(f"{text}: a path with a quote can't be written by COPY; choose another")
    return text
