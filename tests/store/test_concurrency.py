"""Several processes on one store at once: two writers and a reader in a loop.

Writers queue on the store's lock; each sees the other's rows, so the result equals loading the files one
after the other. A reader is never blocked and never sees part of a batch: in every snapshot it reads,
the summaries count exactly the rows `requests` holds, and the row count is one the batches can leave.
"""

from __future__ import annotations

import pytest
from writers import two_writers_and_a_reader


@pytest.mark.parametrize("kind", ["file", "lake"])
def test_two_writers_and_a_reader_at_once(tmp_path, kind):
    db = str(tmp_path / "shared.duckdb") if kind == "file" else f"ducklake:{tmp_path / 'shared.sqlite'}"
    two_writers_and_a_reader(db, tmp_path, 6000)
