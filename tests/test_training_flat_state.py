"""``build(flat_state="on")``: the update over flat float32 buffers computes the bits the
per-parameter update computes (losses, scales, skipped flags, weights, and states once cut back
per parameter by ``StepSpec.flat``), in one node per formula term and one ``Where`` per buffer;
checkpoints, graph mode, export and ``train-graph`` carry the flat buffers as any other value."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest

from amp_rewrite.cli import main
from amp_rewrite.errors import UserError
from amp_rewrite.ir import io
from amp_rewrite.runtime import instrument
from amp_rewrite.training import build
from amp_rewrite.training.graph.flat_state import FLAT
from amp_rewrite.training.graph.optimizers import SGD
from amp_rewrite.training.runner.trainer import Trainer
from models import builders
from tests.helpers import rng

FEATURES, CLASSES = 8, 3


def _step(flat_state: str, model: str = "mlp", **options):
    if model == "cnn":  # Conv weights and biases, BatchNormalization's running statistics carried too
        return build(builders.seed_cnn(image_size=16, widths=(4, 8), classes=CLASSES), loss="cross-entropy",
                     output="probabilities", batchnorm="train", flat_state=flat_state, **options)
    return build(builders.mlp(features=FEATURES, hidden=16, classes=CLASSES), loss="cross-entropy",
                 output="log_probs", flat_state=flat_state, **options)


def _batch(seed: int, model: str = "mlp", poisoned: bool = False) -> dict[str, np.ndarray]:
    shape = (4, 3, 16, 16) if model == "cnn" else (6, FEATURES)
    x = rng(seed).normal(0, 1, shape).astype(np.float32)
    if poisoned:
        x.flat[0] = np.inf
    return {"image" if model == "cnn" else "x": x, "labels": rng(seed + 100).integers(0, CLASSES, shape[0])}


def _per_parameter(trainer: Trainer) -> dict[str, np.ndarray]:
    """Every carried value, keyed as the per-parameter step keys it: each flat buffer cut into its
    parameters' pieces (``StepSpec.flat``: flattened, one after another) and shaped as they are."""
    spec = trainer.spec
    shapes = {c.input: c.shape for c in spec.params}
    found = {}
    for name, value in trainer.state().items():
        if not name.startswith(FLAT + "."):
            found[name] = value
            continue
        role = name.removeprefix(FLAT + ".")
        ends = np.cumsum([int(np.prod(shapes[p])) for p in spec.flat])
        for param, piece in zip(spec.flat, np.split(value, ends[:-1])):
            found[f"{param}.{role}"] = piece.reshape(shapes[param])
    return found


def _assert_same_bits(flat: Trainer, per_parameter: Trainer) -> None:
    """Every carried value, the flat buffers cut per parameter: equal bits."""
    got, want = _per_parameter(flat), per_parameter.state()
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert np.array_equal(got[name], value, equal_nan=True), name


def _assert_close(flat: Trainer, per_parameter: Trainer) -> None:
    """Every carried value, the flat buffers cut per parameter: equal to float32's resolution."""
    got, want = _per_parameter(flat), per_parameter.state()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


CASES = {
    "adamw, dynamic scale": dict(optimizer="adamw", precision="float16"),
    "sgd with momentum, clipped": dict(optimizer="sgd", precision="float32", loss_scale="none", clip_norm=0.5),
    "sgd without momentum, dynamic scale": dict(optimizer=SGD(momentum=0.0), precision="float16"),
    "nesterov, static scale, clipped": dict(optimizer=SGD(nesterov=True), precision="float16", loss_scale=64,
                                            clip_norm=0.3),
    "adamw, accumulated, clipped": dict(optimizer="adamw", precision="float16", accumulate=3, clip_norm=0.5),
    "sgd, accumulated": dict(optimizer="sgd", precision="float32", loss_scale="none", accumulate=2),
}


def _trained(case: str, model: str, exact: bool = True) -> tuple[Trainer, Trainer]:
    """Flat and per-parameter trainers of ``case`` after the same steps, each step's loss, scale and
    skipped flag and every carried value after it the same in both: bit for bit where ``exact``,
    else to float32's resolution (the scales and flags always bit for bit). Steps with an inf in
    their data (where the step checks for one: skipped under a dynamic or static scale, the whole
    window where it accumulates) and a learning rate changed between steps."""
    options = CASES[case]
    checks = options.get("loss_scale", "dynamic" if options["precision"] == "float16" else "none") != "none"
    flat, per_parameter = (Trainer(_step(mode, model, **options), lr=0.05, weight_decay=0.01) for mode in ("on", "off"))
    skipped = []
    for seed in range(1, 8):
        if seed == 5:
            flat.lr = per_parameter.lr = 0.02
        batch = _batch(seed, model, poisoned=checks and seed == 2)  # unchecked, an inf would spoil every step after
        got, want = flat.step(batch), per_parameter.step(batch)
        if exact:
            assert np.array_equal(np.float32(got.loss), np.float32(want.loss), equal_nan=True)
            _assert_same_bits(flat, per_parameter)
        else:
            assert got.loss == pytest.approx(want.loss, rel=1e-6, nan_ok=True)
            _assert_close(flat, per_parameter)
        assert (got.scale, got.skipped) == (want.scale, want.skipped)
        skipped.append(got.skipped)
    assert any(skipped) == checks
    return flat, per_parameter


@pytest.fixture()
def unrewritten(monkeypatch):
    """Steps run without ONNX Runtime's graph rewrites (the trainer asks for its basic ones)."""
    real = instrument.session
    monkeypatch.setattr(instrument, "session", lambda *args, **kwargs: real(*args, **{**kwargs, "optimize": "none"}))


def _clips_a_conv(case: str, model: str) -> bool:
    return "clip_norm" in CASES[case] and model == "cnn"


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("case", CASES)
def test_flat_buffers_train_bit_for_bit_as_per_parameter_tensors(case, model, request):
    """Every step's loss, scale and skipped flag, and every carried value after each step (the flat
    buffers cut per parameter): equal bits. A step that clips a CNN's gradients runs without ONNX
    Runtime's graph rewrites here: see the next test."""
    if _clips_a_conv(case, model):
        request.getfixturevalue("unrewritten")
    flat, per_parameter = _trained(case, model)
    assert flat.spec.flat == [c.input for c in flat.spec.params] and per_parameter.spec.flat == []
    moved = [c.input for c in flat.spec.params if not np.array_equal(flat.value(c.input),
                                                                      flat.step_graph.initial[c.input])]
    assert len(moved) == len(flat.spec.params)


@pytest.mark.parametrize("case", [case for case in CASES if _clips_a_conv(case, "cnn")])
def test_with_graph_rewrites_a_clipped_conv_differs_by_the_order_of_one_sum(case):
    """ONNX Runtime's basic rewrites drop the Transpose that makes a Conv weight gradient before the
    per-parameter step's sum of its squares (a sum of every element reads them in any order), so
    that sum adds in another order than the flat step's, and the clip factor may differ in its last
    bit: the weights agree to float32's resolution, not bit for bit."""
    _trained(case, "cnn", exact=False)


@pytest.mark.parametrize("optimizer, accumulate", [("adamw", 1), ("sgd", 3)])
def test_each_state_and_sum_is_one_buffer_with_one_where(optimizer, accumulate):
    """One carried vector per optimizer state (and per gradient sum), as long as every parameter
    together, owned by none; the per-parameter step's ``Where`` per parameter and per state (and its
    zeroing ``Where`` per sum) become one per vector."""
    flat, per_parameter = (_step(mode, optimizer=optimizer, precision="float16", accumulate=accumulate)
                           for mode in ("on", "off"))
    onnx.checker.check_model(flat.model, full_check=True)
    params = flat.spec.params
    size = sum(int(np.prod(c.shape)) for c in params)
    states = ("exp_avg", "exp_avg_sq") if optimizer == "adamw" else ("momentum",)
    buffers = [c for c in flat.spec.carried if c.input.startswith(FLAT + ".")]
    assert [(c.input, c.shape, c.role, c.of) for c in buffers] == \
        [(f"{FLAT}.{role}", [size], role, None) for role in (*states, *(["grad_sum"] * (accumulate > 1)))]
    assert all(flat.initial[c.input].shape == (size,) and not flat.initial[c.input].any() for c in buffers)
    assert [c.input for c in flat.spec.params] == [c.input for c in per_parameter.spec.params]
    wheres = {name: Counter(n.op_type for n in step.model.graph.node)["Where"]
              for name, step in (("flat", flat), ("per_parameter", per_parameter))}
    held_per_parameter = (1 + len(states) + (accumulate > 1)) * len(params)
    assert wheres["per_parameter"] - wheres["flat"] == held_per_parameter - (1 + len(states) + (accumulate > 1))
    assert len(flat.model.graph.node) < len(per_parameter.model.graph.node)
    json.loads(flat.spec.to_json())


def test_a_checkpoint_of_flat_buffers_resumes_bit_for_bit(tmp_path):
    options = dict(optimizer="adamw", precision="float16")
    whole, resumed = (Trainer(_step("on", **options), lr=0.05) for _ in range(2))
    for seed in range(1, 4):
        whole.step(_batch(seed))
    whole.save(tmp_path / "epoch-1.npz", 1)
    assert resumed.resume(tmp_path / "epoch-1.npz") == 1
    for seed in range(4, 6):
        assert whole.step(_batch(seed)).loss == resumed.step(_batch(seed)).loss
    assert all(np.array_equal(value, resumed.state()[name]) for name, value in whole.state().items())
    per_parameter = Trainer(_step("off", **options))
    with pytest.raises(UserError, match=f"lacks {FLAT}.exp_avg, {FLAT}.exp_avg_sq: .* the other --flat-state layout"):
        whole.load(per_parameter.state())
    with pytest.raises(UserError, match="the other --flat-state layout"):
        per_parameter.load(whole.state())


def test_graph_mode_binds_the_flat_buffers_bit_for_bit():
    fixed_extents = {"x": [6, FEATURES], "labels": [6]}
    step = _step("on", optimizer="adamw", precision="float16", specialize=fixed_extents)
    fixed, ordinary = (Trainer(step, lr=0.05, graph_mode=mode) for mode in (True, False))
    assert fixed.graph_mode
    for seed in range(1, 5):
        batch = _batch(seed, poisoned=seed == 2)
        got, want = fixed.step(batch), ordinary.step(batch)
        assert np.array_equal(np.float32(got.loss), np.float32(want.loss), equal_nan=True)
        assert (got.scale, got.skipped) == (want.scale, want.skipped)
    assert all(np.array_equal(value, ordinary.state()[name]) for name, value in fixed.state().items())


def test_the_weights_and_the_export_name_each_parameter(tmp_path):
    flat, per_parameter = (Trainer(_step(mode, "cnn", optimizer="sgd"), lr=0.05) for mode in ("on", "off"))
    for seed in range(1, 3):
        flat.step(_batch(seed, "cnn"))
        per_parameter.step(_batch(seed, "cnn"))
    weights = flat.weights
    assert sorted(weights) == sorted(per_parameter.weights)
    assert all(np.array_equal(value, per_parameter.weights[name]) for name, value in weights.items())
    io.save(flat.exported(check_on=_batch(3, "cnn")), tmp_path / "flat.onnx", None)
    written = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(tmp_path / "flat.onnx").graph.initializer}
    assert all(np.array_equal(written[name], value) for name, value in weights.items())


def test_train_graph_writes_the_flat_layout(tmp_path):
    path, target = tmp_path / "m.onnx", tmp_path / "step.onnx"
    onnx.save(builders.mlp(features=FEATURES, hidden=16, classes=CLASSES), path)
    assert main(["train-graph", str(path), "--loss", "cross-entropy", "--output", "log_probs", "--flat-state", "on",
                 "--precision", "float32", "-o", str(target), "--quiet"]) == 0
    spec = json.loads((tmp_path / "step.onnx.json").read_text())
    initial = dict(np.load(tmp_path / "step.onnx.init.npz"))
    params = [c for c in spec["carried"] if c["role"] == "param"]
    assert spec["flat"] == [c["input"] for c in params]
    size = sum(int(np.prod(c["shape"])) for c in params)
    assert initial[f"{FLAT}.exp_avg"].shape == initial[f"{FLAT}.exp_avg_sq"].shape == (size,)


def test_an_unknown_layout_is_refused():
    with pytest.raises(UserError, match="--flat-state must be one of off, on"):
        _step("sometimes")
