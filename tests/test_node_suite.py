"""The ONNX backend node test cases, converted and checked against their expected outputs.

Every case with a float32 input or output is converted, must pass the full
checker, and must match the case's expected outputs within fp16 tolerance
(``node_suite.compare``). Three modes:

- ``default``: what a user gets with no options but ``provider=None`` (schemas
  only, so every op with a float16 schema is eligible); no exceptions.
- ``cuda``: the default CUDA provider policy; no exceptions.
- ``low-io``: ``keep_io_types=False``, so graph inputs and outputs are float16
  and nearly every node runs in float16. The exceptions below are cases whose
  inputs or outputs themselves do not survive float16; none is a coloring error.
"""

from __future__ import annotations

import re

import pytest

from models.node_suite import MODEL_DIR_KINDS, float_cases, model_dir_cases
from tests.node_suite import run_case

LOW_IO_EXCEPTIONS = {
    r"test_(log)?softmax_large_number.*": "inputs 10000..10003 are 8 apart in float16: the float16 graph input "
                                          "already loses the differences the softmax depends on",
    r"test_reduce_prod_default_axes_keepdims_example": "the product 4.8e8 exceeds float16: a float16 graph output "
                                                       "cannot hold it",
    r"test_dequantizelinear_e5m2": "outputs up to 9.8e4 exceed float16: a float16 graph output cannot hold them",
    r"test_quantizelinear_(e5m2|int16|uint16)": "the target grid is finer than float16 at these magnitudes: "
                                                "rounding the float16 input first moves values one step",
    r"test_cast(like)?_(no_saturate_)?FLOAT_to_(BFLOAT16|FLOAT8E4M3FNU?Z?|FLOAT8E5M2FNUZ)(_expanded)?":
        "a float16 graph input rounds the value before the cast rounds it again (double rounding)",
    r"test_dynamicquantizelinear_min_adjusted(_expanded)?": "the computed scale depends on float32 input extremes "
                                                            "that float16 input rounding moves",
    r"test_nonmaxsuppression_iou_threshold_boundary": "boxes sit exactly on the IoU threshold; float16 input "
                                                      "rounding moves them across it",
    r"test_ai_onnx_ml_tree_ensemble_set_membership": "set membership tests exact float32 values that float16 "
                                                     "input rounding changes",
}
RANDOM_OUTPUTS = re.compile(r"test_bernoulli_\w+")
"""Random draws, compared with probabilities rounded to float16 in low-io mode: they may or may
not match, so only the conversion and the checker are asserted for them there."""

MODES = {
    "default": dict(keep_io_types=True, provider=None),
    "cuda": dict(keep_io_types=True, provider="CUDAExecutionProvider"),
    "low-io": dict(keep_io_types=False, provider=None),
}


def _expected_failure(mode: str, name: str) -> str | None:
    if mode != "low-io":
        return None
    return next((why for pattern, why in LOW_IO_EXCEPTIONS.items() if re.fullmatch(pattern, name)), None)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_node_cases_convert_check_and_match(mode: str) -> None:
    failures, unexpected_passes, converted_low, total = [], [], 0, 0
    for case in float_cases():
        total += 1
        result = run_case(case, **MODES[mode])
        converted_low += result.low_nodes > 0
        expected = _expected_failure(mode, case.name)
        if mode == "low-io" and RANDOM_OUTPUTS.fullmatch(case.name):
            continue
        if not result.ok and expected is None:
            failures.append(f"{case.name}: {result.detail}")
        elif result.ok and expected is not None and result.detail != "unchanged":
            unexpected_passes.append(case.name)
    assert total > 1300, "the node test cases were not collected"
    assert converted_low > (900 if mode == "low-io" else 200), "too few cases exercised low precision"
    assert not failures, f"{len(failures)} of {total} cases fail:\n" + "\n".join(failures)
    assert not unexpected_passes, f"listed as exceptions but now pass: {unexpected_passes}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_model_directories_convert_check_and_match(mode: str) -> None:
    """onnx's model test directories (``MODEL_DIR_KINDS``: 117 PyTorch exports of modules and
    operators at opsets 6-9, and 23 hand-written models) run as the node cases do; no exceptions.
    The range check runs on every one of them, the 112 below ONNX Runtime's opsets upgraded."""
    results = [run_case(case, **MODES[mode]) for case in model_dir_cases()]
    failures = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert len(results) >= 140, f"the model directories of {MODEL_DIR_KINDS} were not all found"
    assert sum(r.low_nodes > 0 for r in results) > (90 if mode == "low-io" else 25), "too few ran low precision"
    assert not failures, f"{len(failures)} of {len(results)} cases fail:\n" + "\n".join(failures)
    not_run = [f"{r.name}: {r.range_check}" for r in results if not r.range_check.startswith(("measured", "skipped"))]
    assert not not_run, "\n".join(not_run)
    assert sum(r.range_check.startswith("measured") for r in results) > 90
