"""An incident-shaped log with real traffic's ties, for bench_formats.py's `ties` case.

Made from the demo's synthetic log (specdec_core/demo/synthetic.py: weighted configurations, narrow keys
until a fix, hits copying the latest miss) over a small prompt pool, so most hits land on a few keys, then:

- the hottest keys' rows come in bursts of TIE_BURST requests at one millisecond (a service at 1,000
  requests/s logging milliseconds, a popular prompt, a narrow key); a burst keeps its rows' hit flags, so a
  burst holds several misses (cache entries expiring) at the same instant as hundreds of hits;
- timestamps mix RFC 3339 (UTC and +02:00) and integer epoch milliseconds;
- ten fields the contract doesn't know (common.UNKNOWN_FIELDS), prompts with quotes, newlines and
  non-ASCII text, equivalent spellings (`"none"` and null drafts, `top_k` 0 and null, repeated stop
  sequences), a `cached_fingerprint` on some hits, exact duplicate lines and hostile lines;
- the rows shuffled into FILES files.

    make_tie_log(folder, rows) -> folder of FILES JSON Lines files
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

TIE_BURST = 300  # requests per key per millisecond on the hottest keys
HOT_SHARE = 0.0005 # a key with at least this share of the rows is hot: its rows come in bursts
FILES = 4
PROMPTS = 50  # the synthetic log's power law over 50 prompts: the first takes a quarter of the traffic

_TS_SPELLINGS = """CASE hash(seq, 'spelling') % 3  -- # hash-ok
    WHEN 0 THEN to_json(tie_ms)
    WHEN 1 THEN to_json(strftime(make_timestamp(tie_ms * 1000), '%Y-%m-%dT%H:%M:%S.%gZ'))
    ELSE to_json(strftime(make_timestamp((tie_ms + 7200000) * 1000), '%Y-%m-%dT%H:%M:%S.%g+02:00')) END"""

# The rows as they are written: the synthetic record with its new time, hostile spellings and unknown fields.
_RECORDS = """
SELECT request_id, {ts}::JSON AS ts,
       CASE WHEN prompt_no % 5 = 3 THEN 'Grüße "' || prompt || '"' || chr(10) || '\\u00e9 ☃' ELSE prompt END
           AS prompt,
       target_model,
       CASE WHEN draft_model = 'none' AND hash(seq, 'draft') % 2 = 0 THEN NULL ELSE draft_model END  -- # hash-ok
           AS draft_model,
       num_speculative_tokens, temperature, top_p,
       CASE WHEN hash(seq, 'top_k') % 2 = 0 THEN 0 END AS top_k,  -- # hash-ok
       max_tokens, seed,
       CASE WHEN stop IS NOT NULL AND hash(seq, 'stop') % 2 = 0 THEN stop || stop ELSE stop END  -- # hash-ok
           AS stop,
       tokenizer_version, deployment, cache_key, cache_hit,
       CASE WHEN cache_hit AND hot AND hash(seq, 'cached') % 10 = 0 THEN json_object(  -- # hash-ok
           'prompt', sha256(CASE WHEN prompt_no % 5 = 3
                                 THEN 'Grüße "' || prompt || '"' || chr(10) || '\\u00e9 ☃' ELSE prompt END),
           'target_model', target_model, 'draft_model', draft_model,
           'num_speculative_tokens', num_speculative_tokens, 'temperature', temperature, 'top_p', top_p,
           'top_k', NULL, 'max_tokens', max_tokens, 'seed', seed, 'stop', stop,
           'tokenizer_version', tokenizer_version) END AS cached_fingerprint,
       output_text, output_tokens, finish_reason, latency_ms, draft_tokens, accepted_tokens, {unknown}, seq
FROM tied"""


def make_tie_log(folder: Path, rows: int, *, seed: int = 3) -> Path:
    """Write the log as FILES shuffled JSON Lines files in `folder` (hostile lines at each file's end)."""
    from common import HOSTILE, UNKNOWN_FIELDS

    from specdec_core.demo.synthetic import make_synthetic_log

    if folder.is_dir() and len(list(folder.glob("*.jsonl"))) == FILES:
        return folder
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    base = folder.parent / f"{folder.name}-base.jsonl"
    make_synthetic_log(base, rows, seed=seed, prompts=PROMPTS)
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET enable_progress_bar = false")
        con.execute("""
            CREATE TABLE s AS
            SELECT * EXCLUDE (ts, stop), epoch_ms(ts::TIMESTAMPTZ) AS ts_ms, stop::VARCHAR[] AS stop,
                   row_number() OVER () AS seq, split_part(prompt, ' ', 2)::INT AS prompt_no
            FROM read_json(?, format = 'newline_delimited', columns = {
                request_id: 'VARCHAR', ts: 'VARCHAR', prompt: 'VARCHAR', target_model: 'VARCHAR',
                draft_model: 'VARCHAR', num_speculative_tokens: 'INT', temperature: 'DOUBLE', top_p: 'DOUBLE',
                top_k: 'INT', max_tokens: 'INT', seed: 'BIGINT', stop: 'JSON', tokenizer_version: 'VARCHAR',
                deployment: 'VARCHAR', cache_key: 'VARCHAR', cache_hit: 'BOOLEAN', cached_fingerprint: 'JSON',
                output_text: 'VARCHAR', output_tokens: 'INT', finish_reason: 'VARCHAR', latency_ms: 'DOUBLE',
                draft_tokens: 'INT', accepted_tokens: 'INT'})
        """, [str(base)])
        # A hot key's rows, in time order, are cut into bursts of TIE_BURST at the burst's first millisecond.
        con.execute(f"""
            CREATE TABLE tied AS
            WITH k AS (
                SELECT *, count(*) OVER (PARTITION BY deployment, cache_key) >= {max(TIE_BURST, rows * HOT_SHARE)} AS hot,
                       (row_number() OVER (PARTITION BY deployment, cache_key ORDER BY ts_ms, seq) - 1)
                           // {TIE_BURST} AS burst
                FROM s
            )
            SELECT *, CASE WHEN hot THEN min(ts_ms) OVER (PARTITION BY deployment, cache_key, burst)
                           ELSE ts_ms END AS tie_ms
            FROM k
        """)
        records = _RECORDS.replace("{ts}", _TS_SPELLINGS).replace("{unknown}", UNKNOWN_FIELDS)
        con.execute(f"CREATE TABLE out AS SELECT *, hash(seq, 'file') % {FILES} AS file, "  # hash-ok
                    f"hash(seq, 'order') AS place FROM ({records})")  # hash-ok
        # One line in a thousand is written twice (an exact duplicate, as a retried shipper writes it).
        con.execute("INSERT INTO out SELECT * REPLACE (hash(seq, 'again') AS place) FROM out "  # hash-ok
                    "WHERE hash(seq, 'dup') % 1000 = 0")  # hash-ok
        for n in range(FILES):
            path = folder / f"part-{n}.jsonl"
            con.execute(f"COPY (SELECT * EXCLUDE (seq, file, place) FROM out WHERE file = {n} ORDER BY place) "
                        f"TO '{path}' (FORMAT json)")
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(HOSTILE) + "\n")
        stats = con.execute("""
            SELECT count(*), count(*) FILTER (WHERE hot), max(n), count(*) FILTER (WHERE cache_hit),
                   count(*) FILTER (WHERE cache_hit AND hot)
            FROM (SELECT *, count(*) OVER (PARTITION BY deployment, cache_key, tie_ms) AS n FROM tied)
        """).fetchall()[0]
    finally:
        con.close()
    base.unlink()
    print(f"generated {stats[0]:,} tie-heavy requests in {time.perf_counter() - started:.0f} s: {stats[1]:,} on hot "
          f"keys in bursts of up to {stats[2]} at one millisecond, {stats[3]:,} hits ({stats[4]:,} on hot keys)")
    return folder
