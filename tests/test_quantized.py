"""Quantized (QDQ) models: the op of each DequantizeLinear -> op -> QuantizeLinear unit stays
float32 (``KeepQuantizedUnits``), so ONNX Runtime still fuses it into an integer kernel, and the
check compares such a model as deployed with the float32 model as deployed."""

from __future__ import annotations

import numpy as np
import onnx

from amp_rewrite import check, convert
from models import builders
from tests.helpers import colors, model, optimized, rng, run

SCALES = {"s": np.array(0.05, np.float32), "z": np.array(128, np.uint8), "ws": np.array(0.01, np.float32),
          "wq": rng().integers(0, 255, (16, 16)).astype(np.uint8), "s2": np.array(0.2, np.float32)}


def _qdq_matmul() -> onnx.ModelProto:
    """A quantized MatMul as ONNX Runtime's quantizer writes it, beside a MatMul of the float
    input and the dequantized weight (weight-only quantization: no QuantizeLinear after it)."""
    return model("""(float[4,16] x) => (float[4,16] y, float[4,16] f) {
        [q_in] xq = QuantizeLinear(x, s, z)
        [dq_in] xd = DequantizeLinear(xq, s, z)
        [dq_w] wd = DequantizeLinear(wq, ws, z)
        [unit] m = MatMul(xd, wd)
        [q_out] mq = QuantizeLinear(m, s2, z)
        [dq_out] y = DequantizeLinear(mq, s2, z)
        [weight_only] f = MatMul(x, wd) }""", SCALES, opset=19)


def test_the_op_between_dequantize_and_quantize_stays_float32_and_fuses(tmp_path) -> None:
    m = _qdq_matmul()
    out, report = convert(m)
    reasons = {d.node: d.reason for d in report.decisions}
    unit = "quantized node unit: MatMul 'unit' reads DequantizeLinear and feeds QuantizeLinear"
    assert all(reasons[n].startswith(unit) for n in ("unit", "dq_in", "dq_w", "q_out")), reasons
    assert colors(out)["unit"] == "fp32" and colors(out)["weight_only"] == "low"
    fused = [n.op_type for n in optimized(out, tmp_path).graph.node]
    assert "QLinearMatMul" in fused and "MatMul" in fused, fused  # the unit fused; the float16 MatMul as it is
    x = rng(1).normal(0, 2, (4, 16)).astype(np.float32)
    want, got = run(m, x=x), run(out, x=x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=2e-2, atol=2e-2)


def test_a_model_onnxruntime_quantized_checks_against_its_float32_run_as_deployed(tmp_path) -> None:
    """ONNX Runtime fuses the quantized transformer's units into integer kernels whose rounding
    differs from the float32 graph's DequantizeLinear -> MatMul -> QuantizeLinear by more than the
    tolerance: as deployed, the mixed model is compared with the float32 model as deployed."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from amp_rewrite.inputs import samples

    original = builders.transformer()
    onnx.save(original, tmp_path / "t.onnx")
    data = samples.generate(original, 4, None, 0)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(data)

        def get_next(self):
            return next(self.left, None)

    quantize_static(tmp_path / "t.onnx", tmp_path / "q.onnx", Reader(), quant_format=QuantFormat.QDQ)
    quantized = onnx.load(tmp_path / "q.onnx")
    mixed, report = convert(quantized)
    assert sum(d.reason.startswith("quantized node unit") for d in report.decisions) >= 6
    result = check(quantized, mixed)
    assert result and result.runs == 4, result.table()
    assert {o.run for o in result.outputs} == {"both deployed"}, result.table()
    assert "compared with the float32 model as deployed" in result.table()
    alone = check(quantized, quantized, deployed=False)  # its integer kernels are what differ
    assert alone and alone.outputs[0].errors.rel_l2 == 0
