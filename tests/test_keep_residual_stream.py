"""KeepResidualStream: a training step's residual-stream sums stay float32; other sums, and
every sum without the option, are the policy's."""

from __future__ import annotations

import numpy as np

from amp_rewrite import ConvertOptions, convert
from tests.helpers import colors, model, rng

WEIGHTS = {name: rng(i).normal(0, 0.1, (8, 8)).astype(np.float32) for i, name in enumerate(("w1", "w2", "w3"))}


def _pre_norm() -> str:
    """Three blocks whose sums are the next block's skip (a pre-norm transformer's stream); the
    middle block reads its stream through a Reshape, which only moves data."""
    return """(float[4,8] x) => (float[4,8] y) {
      [mm1] f1 = MatMul(x, w1)
      [add1] s1 = Add(x, f1)
      [mm2] f2 = MatMul(s1, w2)
      [add2] s2 = Add(f2, s1)
      shape = Constant<value = int64[2] {4, 8}>()
      [move] r2 = Reshape(s2, shape)
      [mm3] f3 = MatMul(r2, w3)
      [add3] y = Add(r2, f3)
    }"""


def _post_norm() -> str:
    """Each sum renormalised (a LayerNormalization) before the next block: no stream."""
    return """(float[4,8] x) => (float[4,8] y) {
      gamma = Constant<value = float[8] {1, 1, 1, 1, 1, 1, 1, 1}>()
      [mm1] f1 = MatMul(x, w1)
      [add1] s1 = Add(x, f1)
      [ln1] n1 = LayerNormalization(s1, gamma)
      [mm2] f2 = MatMul(n1, w2)
      [add2] y = Add(n1, f2)
    }"""


def _converted(text: str, stream: bool):
    options = ConvertOptions(provider=None, range_check="off", fp32_residual_stream=stream)
    converted, _ = convert(model(text, WEIGHTS), options=options)
    return colors(converted)


def test_the_stream_sums_are_float32_and_the_blocks_low() -> None:
    found = _converted(_pre_norm(), stream=True)
    assert {name: found[name] for name in ("add1", "add2", "add3")} == {"add1": "fp32", "add2": "fp32", "add3": "fp32"}
    assert {found[name] for name in ("mm1", "mm2", "mm3")} == {"low"}


def test_without_the_option_the_stream_is_the_policys() -> None:
    found = _converted(_pre_norm(), stream=False)
    assert found["add1"] == found["add2"] == found["mm1"] == "low"


def test_a_renormalised_sum_is_not_a_stream() -> None:
    """A post-norm block's sum is renormalised before the next block reads it: the option
    changes nothing there."""
    assert _converted(_post_norm(), stream=True) == _converted(_post_norm(), stream=False)
