"""The background replay jobs a long-running dashboard starts stay bounded: the oldest finished ones go."""

from __future__ import annotations

import threading

from helpers import STAND_IN_DECODER

from specdec_core.replay import jobs
from specdec_core.store.connection import Store


def test_finished_jobs_are_pruned_oldest_first_and_a_running_job_is_kept(tmp_path):
    store = Store(tmp_path / "unused.duckdb")  # no request ids: the store is never opened
    release = threading.Event()

    def held_decoder() -> str:
        release.wait(60)
        return STAND_IN_DECODER

    running = jobs.start_job(store, [], held_decoder)
    finished = [jobs.start_job(store, [], lambda: STAND_IN_DECODER) for _ in range(jobs.KEEP_FINISHED + 5)]
    for job in finished:
        assert job.wait(30)
    latest = jobs.start_job(store, [], lambda: STAND_IN_DECODER)  # starting a job prunes
    try:
        assert [jobs.job(j.job_id) for j in finished[:5]] == [None] * 5
        assert all(jobs.job(j.job_id) is j for j in finished[5:])
        assert jobs.job(running.job_id) is running and not running.finished
        assert jobs.job(latest.job_id) is latest
    finally:
        release.set()
        assert running.wait(30) and latest.wait(30)
