"""Running the ONNX backend node test cases (``models/node_suite.py``) through convert and comparing
their outputs with the expected ones (shared by test_node_suite, test_numerics and test_light_models)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto
from onnx.reference.ops.op_conv import Conv
from onnx.reference.ops.op_gemm import Gemm_7
from onnx.reference.ops.op_matmul import MatMul

from amp_rewrite import convert
from tests.reference_ops import evaluator

RTOL = 1e-2
"""fp16 tolerance: 10 ulps of float16 relative to each element ..."""
SCALE_ATOL = 4e-3
"""... plus 4 ulps relative to the output's largest magnitude (cancellation in sums)."""


@dataclass
class CaseResult:
    name: str
    ok: bool
    detail: str = ""
    low_nodes: int = 0
    range_check: str = ""
    """The report's line on the range check."""


def _accumulating_in_float32(base: type) -> type:
    """``base``, a reference op, computing float16 inputs in float32 and rounding its outputs
    back, as Tensor Core kernels accumulate (and as fast as numpy's float32 BLAS)."""

    def _run(self, *inputs, **attributes):
        if not any(x is not None and x.dtype == np.float16 for x in inputs):
            return base._run(self, *inputs, **attributes)
        wide = [None if x is None else x.astype(np.float32) for x in inputs]
        return tuple(y.astype(np.float16) for y in base._run(self, *wide, **attributes))

    return type(base.__name__.split("_")[0], (base,), {"op_domain": "", "_run": _run})


ACCUMULATING_IN_FLOAT32 = [_accumulating_in_float32(op) for op in (Conv, Gemm_7, MatMul)]
"""Conv, Gemm and MatMul for ``evaluate(..., accumulate=True)``: numpy has no float16 BLAS, so
the reference evaluator's float16 products take minutes on a VGG."""


def evaluate(model: onnx.ModelProto, feeds: dict, accumulate: bool = False) -> list:
    """Outputs from onnx's reference evaluator (``reference_ops``: its wrong ops corrected), or
    from ONNX Runtime's CPU provider for the few ops the evaluator lacks (Scatter) or gets wrong
    (Scan with an outer-scope sum).
    ``accumulate``: matrix products and convolutions of float16 values accumulate in float32."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return evaluator(model, ACCUMULATING_IN_FLOAT32 if accumulate else None).run(None, feeds)
        except Exception:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 4
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return session.run(None, feeds)


def reference_reproduces(case) -> bool:
    """Whether the evaluators, on the float32 model, give the case's expected outputs."""
    for inputs, expected in case.data_sets:
        try:
            actual = evaluate(case.model, {i.name: _numpy(a) for i, a in zip(case.model.graph.input, inputs)})
        except Exception:
            return False
        if any(compare(g, w) for g, w in zip(actual, expected)):
            return False
    return True


def _runs(model: onnx.ModelProto, inputs) -> bool:
    """Whether an evaluator runs ``model`` on ``inputs`` (none runs ai.onnx.preview.training's Gradient)."""
    try:
        evaluate(model, {i.name: _numpy(a) for i, a in zip(model.graph.input, inputs)})
    except Exception:
        return False
    return True


def passes_full_check(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def run_case(case, keep_io_types: bool, provider: str | None = None) -> CaseResult:
    """Convert one case, check it, and compare its outputs with the expected ones.

    The converted model must pass the full checker whenever the original does (a
    few originals fail onnx's own function-body inference); otherwise the plain
    checker. Where no evaluator reproduces the expected outputs from the float32
    model itself (random ops, float8 rounding), the converted model is compared
    with the original run through the same evaluator instead; where none runs the
    float32 model at all, the conversion and the checker are all that is asserted.
    """
    model, report = convert(case.model, provider=provider, keep_io_types=keep_io_types)
    onnx.checker.check_model(model, full_check=passes_full_check(case.model))
    if model.SerializeToString() == case.model.SerializeToString():
        return CaseResult(case.name, True, "unchanged", range_check=report.range_check)
    reproduced = reference_reproduces(case)
    if not reproduced and not _runs(case.model, case.data_sets[0][0]):
        return CaseResult(case.name, True, "no runtime runs the float32 model", report.low_nodes,
                          report.range_check)
    inputs_by_name = {v.name: v for v in model.graph.input}
    for inputs, expected in case.data_sets:
        feeds = {info.name: _as_type(array, inputs_by_name[info.name].type.tensor_type.elem_type)
                 for info, array in zip(case.model.graph.input, inputs)}
        if not reproduced:
            expected = evaluate(case.model, {i.name: _numpy(a) for i, a in zip(case.model.graph.input, inputs)})
        actual = evaluate(model, feeds)
        for info, got, want in zip(case.model.graph.output, actual, expected):
            problem = compare(got, want)
            if problem:
                return CaseResult(case.name, False, f"{info.name}: {problem}", report.low_nodes,
                                  report.range_check)
    return CaseResult(case.name, True, low_nodes=report.low_nodes, range_check=report.range_check)


def _numpy(value):
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_numpy(v) for v in value]
    return value


def _as_type(array, elem_type: int):
    array = _numpy(array)
    low = elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    if isinstance(array, (np.ndarray, np.generic)) and array.dtype == np.float32 and low:
        return np.asarray(array).astype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    return array


def compare(got, want) -> str | None:
    """Why ``got`` is not ``want`` within fp16 tolerance, or None (sequences compared itemwise)."""
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return "sequence length differs"
        return next((p for g, w in zip(got, want) if (p := compare(g, w))), None)
    got, want = np.asarray(_numpy(got)), np.asarray(_numpy(want))
    if want.dtype.kind not in "fc" or got.dtype.kind not in "fc":
        if got.shape != want.shape or not np.array_equal(got, want):
            return "integer or boolean output differs"
        return None
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if got64.shape != want64.shape:
        return f"shape {got64.shape} != {want64.shape}"
    finite = np.isfinite(want64)
    if not np.array_equal(np.isnan(got64), np.isnan(want64)) or not np.array_equal(
            got64[~finite & ~np.isnan(want64)], want64[~finite & ~np.isnan(want64)]):
        return "NaN/Inf pattern differs"
    if not finite.any():
        return None
    scale = float(np.abs(want64[finite]).max())
    err = np.abs(got64[finite] - want64[finite])
    bound = RTOL * np.abs(want64[finite]) + SCALE_ATOL * scale + 1e-6
    worst = float((err / bound).max())
    return None if worst <= 1 else f"error {float(err.max()):.3g} beyond tolerance (x{worst:.1f}), scale {scale:.3g}"


def emulation_ulps(case) -> float | str:
    """Largest gap between ONNX Runtime running ``emulated(converted)`` and the reference
    evaluator running the float16 model itself, in float16 ulps of the output's largest
    magnitude; or why the case cannot be compared (a string)."""
    from amp_rewrite.runtime import instrument
    from amp_rewrite.runtime.emulate import emulated

    model, report = convert(case.model, provider=None, keep_io_types=False)
    if not report.low_nodes:
        return "no low-precision node"
    inputs, _ = case.data_sets[0]
    feeds = {i.name: _numpy(a) for i, a in zip(case.model.graph.input, inputs)}
    if any(not isinstance(a, np.ndarray) for a in feeds.values()):
        return "sequence or optional inputs"
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    low_feeds = {name: _as_type(a, types[name]) for name, a in feeds.items()}
    try:
        original = instrument.run(instrument.session(case.model), feeds)
        got = instrument.run(instrument.session(emulated(model)), low_feeds)
    except Exception:
        return "onnxruntime cannot run it"
    if any(compare(original[o.name], w) for o, w in zip(case.model.graph.output, evaluate(case.model, feeds))):
        return "the evaluators disagree on the float32 model"
    worst = 0.0
    for info, want in zip(model.graph.output, evaluate(model, low_feeds)):
        g, w = np.asarray(got[info.name]).astype(np.float64), np.asarray(want).astype(np.float64)
        if w.dtype.kind != "f" or not w.size:
            continue
        if not np.array_equal(np.isfinite(g), np.isfinite(w)):
            return float("inf")
        finite = np.isfinite(w)
        if finite.any():
            scale = np.spacing(np.float16(min(np.abs(w[finite]).max(), 65504))).astype(np.float64)
            worst = max(worst, float(np.abs(g[finite] - w[finite]).max() / scale))
    return worst
