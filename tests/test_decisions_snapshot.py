"""models/decisions.py: a snapshot holds a model's decisions, and a compare names what moved,
precisions first."""

from __future__ import annotations

import copy

from models import builders, decisions


def test_a_snapshot_holds_the_decisions_and_a_compare_names_what_moved() -> None:
    snapshot = decisions.decisions(builders.mlp())
    assert "low" in snapshot["precision"].values() and set(snapshot["precision"].values()) <= {"low", "fp32"}
    assert snapshot["reason"].keys() == snapshot["precision"].keys() and snapshot["range_check"]
    flipped = copy.deepcopy(snapshot)
    node = next(n for n, p in flipped["precision"].items() if p == "low")
    flipped["precision"][node] = "fp32"
    reworded = dict(snapshot, range_check="skipped: range_check=off")
    before = {"a": snapshot, "b": snapshot}
    assert decisions.compare(before, before) == []
    assert decisions.compare(before, {"a": reworded, "b": flipped, "c": snapshot}) == [
        f"b: precision precision of {node}", "c: only in after", "a: range_check"]
