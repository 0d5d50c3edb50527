"""Replay a logged request with its full identity, classify how production differs, and diff the two."""

from specdec_core.replay.run import ReplayResult, replay, replay_many, replays_table

__all__ = ["ReplayResult", "replay", "replay_many", "replays_table"]
