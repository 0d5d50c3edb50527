"""Names the contracts fix that a command line offers before any work is done: the mismatch report's kinds
(log-schema.md), `specdec impact`'s dimensions and the purge plan's default key template (remediation.md).

They live here, not beside the code that uses them, so that building `specdec`'s parser imports no analysis
(pandas and pyarrow: a third of a second of every command's start)."""

REPORT_KINDS = ("contaminated_hit", "length_violation", "replay_mismatch")
IMPACT_DIMENSIONS = ("consumer", "experiment", "deployment")
DEFAULT_KEY_TEMPLATE = "{cache_key}"
