"""Getting requests into the store: stage a log's lines, check them against the contract, quarantine what
breaks it, record identities, write the requests and bring the derived tables up to date; live follow of
files and objects; `collect`, the OTLP receiver that spools what it acknowledges into the follow path."""

from specdec_core.ingestion.follow import Follower
from specdec_core.ingestion.load import IngestResult, ingest
from specdec_core.ingestion.staging import IngestLimits

__all__ = ["Follower", "IngestLimits", "IngestResult", "ingest"]
