"""docs/reference/ is the project's own copy of the contracts the code follows (the log record, the metrics,
remediation, the design). Where the shared folder they come from sits beside the checkout (`../shared`),
each copy equals its original byte for byte; a fresh clone carries them in docs/ alone."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"
CONTRACTS = ("log-schema.md", "metrics.md", "remediation.md", "design.md")
HEADINGS = {"log-schema.md": "# Request log contract", "design.md": "# specdec-triage: design"}


def differing(reference: Path, shared: Path) -> list[str]:
    """The contracts whose copy in `reference` is not byte for byte the one in `shared` (or is missing)."""
    return [name for name in CONTRACTS
            if not (reference / name).is_file() or (reference / name).read_bytes() != (shared / name).read_bytes()]


def test_docs_holds_every_contract():
    for name in CONTRACTS:
        text = (REFERENCE / name).read_text(encoding="utf-8")
        assert text.startswith("# ") and len(text) > 1000, name
    for name, heading in HEADINGS.items():
        assert (REFERENCE / name).read_text(encoding="utf-8").startswith(heading + "\n")


def test_the_copies_equal_the_shared_contracts_where_they_sit_beside_the_checkout():
    shared = REPO.parent / "shared"
    if not all((shared / name).is_file() for name in CONTRACTS):
        assert not shared.is_dir() or not any(shared.glob("*.md")), f"{shared} holds only some of {CONTRACTS}"
        return  # a fresh clone: docs/reference is the contract
    assert differing(REFERENCE, shared) == [], f"copy {shared}/*.md into docs/reference/"


def test_a_changed_or_missing_copy_is_found(tmp_path):
    shared, copy = tmp_path / "shared", tmp_path / "reference"
    shared.mkdir()
    copy.mkdir()
    for name in CONTRACTS:
        (shared / name).write_bytes((REFERENCE / name).read_bytes())
        (copy / name).write_bytes((REFERENCE / name).read_bytes())
    assert differing(copy, shared) == []
    (copy / "metrics.md").write_bytes((REFERENCE / "metrics.md").read_bytes() + b"\n")
    (copy / "design.md").unlink()
    assert differing(copy, shared) == ["metrics.md", "design.md"]
