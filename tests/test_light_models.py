"""The real-architecture models shipped in onnx (``onnx/backend/test/data/light``).

As shipped every weight is 0.02 and activations reach 1e10 and more: the
converter must notice (range check) and keep those regions in float32, so the
converted model never gives NaN or Inf where float32 does not. With random
weights (He initialisation, BatchNorm statistics near 1) most of the network
converts (deep residual sums that grow past the range-check limit stay float32),
and its outputs match float32's. The mixed model runs on onnx's reference evaluator
(``tests/reference_ops``: its wrong LRN, BatchNormalization and opset-9 Softmax corrected)
with its float16 convolutions and matrix products accumulating in float32, as Tensor
Cores do (numpy has no float16 BLAS: VGG-19 took two minutes otherwise); every other op
and every stored value stays float16. The float32 model runs on ONNX Runtime (the evaluator
took half a minute on Inception-v2 for the same values).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from amp_rewrite import convert
from amp_rewrite.runtime import expose, instrument
from models.light import LIGHT, feed, randomize_weights, with_batch
from tests.node_suite import evaluate

REL_TOLERANCE = 2e-2
"""Max |mixed - fp32| relative to the output's largest magnitude, after 20-100 float16 layers."""


def _compared(model: onnx.ModelProto) -> list[str]:
    """The values compared: the first output, and where a Softmax makes it, the Softmax's input
    (the logits), whose error is the one judged. A softmax over the shipped models' logits of
    1e9 and more turns float32's own rounding of equal logits into a different output (SqueezeNet:
    0.001 everywhere, or 1/32 on 32 classes), while the Softmax itself stays float32 (policy)."""
    output = model.graph.output[0].name
    softmax = next((n for n in model.graph.node if output in n.output and n.op_type == "Softmax"), None)
    return [output] if softmax is None else [output, softmax.input[0]]


def _compare(original: onnx.ModelProto, mixed: onnx.ModelProto) -> tuple[float, bool]:
    """Relative max error of the mixed model against the float32 one (the last value of
    ``_compared``), the mixed one run by onnx's reference evaluator (true float16 arithmetic),
    the float32 one by ONNX Runtime; and whether NaN/Inf appeared in any value compared."""
    feeds = feed(original)
    names = _compared(original)
    keys = [(0, name) for name in names]
    wanted = instrument.run(instrument.session(expose.expose(original, keys).model), feeds, names)
    exposed = expose.expose(mixed, keys).model
    computed = dict(zip((o.name for o in exposed.graph.output), evaluate(exposed, feeds, accumulate=True)))
    wants, gots = ([np.asarray(values[n], np.float64) for n in names] for values in (wanted, computed))
    new_nonfinite = any(bool((~np.isfinite(g) & np.isfinite(w)).any()) for g, w in zip(gots, wants))
    want, got = wants[-1], gots[-1]
    finite = np.isfinite(want) & np.isfinite(got)
    scale = max(float(np.abs(want[finite]).max()), 1e-30) if finite.any() else 1.0
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale, new_nonfinite


@pytest.mark.slow
@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_model_as_shipped_never_gains_nan(path: str) -> None:
    model = onnx.load(path)
    mixed, report = convert(model)
    onnx.checker.check_model(mixed, full_check=True)
    assert report.range_check.startswith("measured")
    relative, new_nonfinite = _compare(model, mixed)
    assert not new_nonfinite, "the mixed model gives NaN/Inf where float32 does not"
    assert relative < REL_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_model_with_random_weights_matches_fp32(path: str) -> None:
    model = randomize_weights(onnx.load(path))
    mixed, report = convert(model)
    onnx.checker.check_model(mixed, full_check=True)
    assert report.low_nodes >= 0.5 * report.candidates, report.summary()
    relative, new_nonfinite = _compare(model, mixed)
    assert not new_nonfinite
    assert relative < REL_TOLERANCE, f"relative error {relative:.3g}"


@pytest.mark.parametrize("name", ["light_squeezenet.onnx", "light_inception_v1.onnx"])
def test_with_batch_runs_a_fixed_batch_model_at_another_batch(name: str) -> None:
    """inception_v1 reshapes to a constant [1, 1024]: with_batch makes that [0, 1024] (0: the input's extent)."""
    model = randomize_weights(onnx.load(next(p for p in LIGHT if p.endswith(name))))
    one, four = feed(model), feed(with_batch(model, 4))
    assert next(iter(four.values())).shape[0] == 4
    single = instrument.run(instrument.session(model), one)
    batched = instrument.run(instrument.session(with_batch(model, 4)), {k: np.repeat(v, 4, 0) for k, v in one.items()})
    for name_, value in single.items():
        assert batched[name_].shape[0] == 4
        np.testing.assert_allclose(batched[name_], np.repeat(value, 4, 0), rtol=1e-4, atol=1e-5)
