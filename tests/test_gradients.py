"""Every gradient rule against central finite differences in float64 (cases in ``tests/gradcases``).

Each case's gradient graph must pass the full ONNX checker, match finite
differences run by ONNX's reference evaluator in float64, and (float32) run on
ONNX Runtime's CPU provider with the same result.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gradcases import CASES, Case
from tests.gradcheck import analytic, assert_close, case_model, numeric


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rule_matches_finite_differences(case: Case):
    model, wrt = case_model(case)
    assert wrt, "a case differentiates at least one input"
    want = numeric(model, wrt, case.eps)
    got = analytic(model, wrt)
    assert_close(got, want, case.rtol, case.atol, f"{case.name} (reference, float64)")
    if case.ort:
        model32, _ = case_model(case, np.float32)
        assert_close(analytic(model32, wrt, runner="ort"), want, 2e-3, 1e-4, f"{case.name} (ONNX Runtime, float32)")
