"""models/kernel_check.py: the kernel table against what ONNX Runtime's CPU provider runs.

Sin has no float16 CPU kernel (ONNX Runtime inserts casts around it), Transpose has one,
CastLike has none but is inlined into a Cast that has; Relu has no bfloat16 kernel and, as
ONNX Runtime inserts no casts for bfloat16, its session cannot be created.
"""

from __future__ import annotations

import json

import pytest

from amp_rewrite.policy.kernels import kernel_table
from models import kernel_check as kc

CPU = "CPUExecutionProvider"


@pytest.fixture(scope="module")
def float16() -> kc.Check:
    return kc.check(CPU, "float16", ops=["Sin", "Transpose", "CastLike"], isolate=False)


def by_op(result: kc.Check, op: str) -> list[kc.Finding]:
    found = [f for f in result.findings if f.op == op]
    assert found, f"no case of {op} was checked"
    return found


def test_detects_the_cast_fallback_the_table_predicts(float16):
    assert not kernel_table(CPU).supports("", "Sin", 7, "float16", frozenset({"T"}))
    for finding in by_op(float16, "Sin"):
        assert (finding.table, finding.runtime) == (False, kc.FALLBACK), finding
        assert kc.INSERTED_CAST in finding.seen
        assert finding.agrees


def test_detects_a_float16_kernel(float16):
    for finding in by_op(float16, "Transpose"):
        assert (finding.table, finding.runtime, finding.agrees) == (True, kc.LOW, True), finding
        assert "no inserted cast" in finding.seen


def test_castlike_is_inlined_into_a_cast_that_runs_float16(float16):
    checked = [f for f in by_op(float16, "CastLike") if f.agrees is not None]
    assert checked and all(f.table and f.runtime == kc.LOW for f in checked), checked
    assert "function body" in checked[0].seen


def test_agreement_and_report(float16, tmp_path):
    assert float16.disagreements == []
    json_path, md_path = kc.write(float16, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["disagreements"] == [] and data["counts"]["table float32 / runtime fallback"] >= 2
    assert "## Disagreements\n\nnone" in md_path.read_text()
    assert float16.summary().startswith(f"kernel check {CPU} float16")


def test_a_missing_kernel_shows_as_a_disagreement(float16):
    """A table that claimed a Sin kernel would be caught: the finding for Sin flips."""
    wrong = [kc.Finding(**{**vars(f), "table": True}) for f in by_op(float16, "Sin")]
    assert all(f.agrees is False for f in wrong)
    assert "| Sin |" in kc.markdown(kc.Check(CPU, "float16", "", "", findings=wrong))


def test_bfloat16_without_kernel_fails_to_create():
    result = kc.check(CPU, "bfloat16", ops=["Relu"], isolate=False)
    for finding in by_op(result, "Relu"):
        assert (finding.table, finding.runtime, finding.agrees) == (False, kc.FALLBACK, True), finding
        assert kc.NO_KERNEL in finding.seen
