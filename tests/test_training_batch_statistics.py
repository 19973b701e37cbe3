"""Train-mode BatchNormalization's two formulations (``training/batch_statistics.py``).

The ``layer-norm`` formulation takes per-(n, c) statistics from LayerNormalization, combines
them per channel in float32 and applies them with an inference-mode BatchNormalization; its
backward comes from the LayerNormalization rule (through Mean and InvStdDev) and the
BatchNormalization rule (through the mean input, activation-sized sums as LayerNormalization
means). These tests state what it must keep of the ``decomposed`` one (the same forward,
running statistics and gradients) and what it must change (no float32 tensor the size of the
activation once the mixed-precision rewrite makes it float16).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.training import LossScale, build, gradient_model
from amp_rewrite.training.graph import batch_statistics
from amp_rewrite.training.graph.modes import batchnorm_to_train_mode
from amp_rewrite.training.runner.trainer import Trainer
from tests.gradcheck import assert_close, directional_check, ort_run, with_loss

FORMULATIONS = batch_statistics.FORMULATIONS


def _bn_model(shape: tuple[int, ...], opset: int = 17, epsilon: float = 1e-3,
              x_value: np.ndarray | None = None) -> onnx.ModelProto:
    """One BatchNormalization (momentum 0.8) of ``x``: a graph input, or the initializer ``x_value``."""
    c = shape[1]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("gamma", rng.uniform(0.5, 2, c)), ("beta", rng.normal(0, 1, c)), ("mean", rng.normal(0, 1, c)),
        ("var", rng.uniform(0.5, 2, c)))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    if x_value is not None:
        inits.append(numpy_helper.from_array(x_value, "x"))
        inputs = []
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], momentum=0.8,
                              epsilon=epsilon)]
    graph = helper.make_graph(nodes, "bn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _train_mode(model: onnx.ModelProto, formulation: str, monkeypatch) -> tuple[onnx.ModelProto, dict, list[str]]:
    """``model`` in train mode with ``formulation``; (model, running statistics' feeds, their next values)."""
    monkeypatch.setattr(batch_statistics, "FORMULATION", formulation)
    stats = batchnorm_to_train_mode(model)
    for stat in stats:
        model.graph.output.append(helper.make_tensor_value_info(stat.output, TensorProto.FLOAT, list(stat.value.shape)))
    onnx.checker.check_model(model, full_check=True)
    return model, {s.input: s.value for s in stats}, [s.output for s in stats]


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (3, 2, 7), (2, 3, 2, 3, 4)], ids=["4d", "3d", "5d"])
def test_forward_and_running_statistics_equal_the_decomposition(shape, monkeypatch):
    """y, the running mean and the running variance (unbiased) of both formulations agree in
    float32 within 1e-5 of their largest magnitude, on data far from zero mean."""
    x = np.random.default_rng(1).normal(3.0, 2.0, shape).astype(np.float32)
    got = {}
    for formulation in FORMULATIONS:
        model, feeds, outputs = _train_mode(_bn_model(shape), formulation, monkeypatch)
        assert ("LayerNormalization" in _ops(model)) == (formulation == "layer-norm")
        got[formulation] = ort_run(model, {"x": x, **feeds}, ["y", *outputs])
    for (name, want), have in zip(got["decomposed"].items(), got["layer-norm"].values()):
        np.testing.assert_allclose(have, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=name)


@pytest.mark.parametrize("opset, shape", [(16, (4, 3, 5, 6)), (17, (8, 3))], ids=["opset-16", "rank-2"])
def test_the_decomposition_stays_where_layer_normalization_does_not_apply(opset, shape, monkeypatch):
    """LayerNormalization is an opset-17 op, and a [N, C] input has no spatial axes to normalise."""
    model, _, _ = _train_mode(_bn_model(shape, opset=opset), "layer-norm", monkeypatch)
    assert "LayerNormalization" not in _ops(model) and "ReduceMean" in _ops(model)


def _train_mode_bn(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, epsilon: float) -> np.ndarray:
    axes = (0, *range(2, x.ndim))
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma.reshape(per_channel) + beta.reshape(per_channel)


def _central_differences(loss, values: dict[str, np.ndarray], h: float = 1e-6) -> dict[str, np.ndarray]:
    """d loss / d value for each of ``values`` (float64 arrays), element by element (``tests/gradcheck.py``'s
    ``numeric`` does this for a model; here ``loss`` is a numpy function)."""

    def moved(name: str, i: int, step: float) -> float:
        shifted = values[name].copy()
        shifted.flat[i] += step
        return loss(**{**values, name: shifted})

    return {f"{name}_grad": np.reshape([(moved(name, i, h) - moved(name, i, -h)) / (2 * h) for i in range(v.size)],
                                       v.shape) for name, v in values.items()}


def test_block_gradients_match_float64_finite_differences_and_the_decomposition(monkeypatch):
    """dx, dscale and dbias of the whole train-mode block (ONNX Runtime, float32) against central
    differences of train-mode BatchNormalization in float64 (numpy: onnx's reference evaluator
    keeps LayerNormalization's statistics in X's type, against the schema), and against the
    decomposed formulation's gradients; then a directional check on ONNX Runtime."""
    shape, epsilon = (3, 2, 3, 4), 1e-3
    x = np.random.default_rng(2).normal(1.5, 2.0, shape).astype(np.float32)
    wrt = ["x", "gamma", "beta"]
    got = {}
    for formulation in FORMULATIONS:
        model, feeds, _ = _train_mode(_bn_model(shape, epsilon=epsilon, x_value=x), formulation, monkeypatch)
        model = with_loss(model, feeds)  # loss = sum(y * loss_weights)
        grad = gradient_model(model, "loss", wrt)
        onnx.checker.check_model(grad, full_check=True)
        got[formulation] = ort_run(grad, feeds, [f"{w}_grad" for w in wrt])
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}

    def loss(x, gamma, beta):
        return float(np.sum(_train_mode_bn(x, gamma, beta, epsilon) * inits["loss_weights"]))

    want = _central_differences(loss, {k: inits[k] for k in wrt})
    assert_close(got["layer-norm"], want, 1e-4, 1e-5, "layer-norm against float64 finite differences")
    assert_close(got["layer-norm"], {k: v.astype(np.float64) for k, v in got["decomposed"].items()}, 1e-5, 1e-7,
                 "layer-norm against the decomposition")
    directional_check(model, feeds, wrt)


def _layer_norm(x, scale, axis, epsilon):
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axes, keepdims=True)
    inv_std = 1 / np.sqrt(x.var(axes, keepdims=True) + epsilon)
    return (x - mean) * inv_std * scale, mean, inv_std


@pytest.mark.parametrize("read, axis, outputs", [
    ((0, 1, 2), -1, ["y", "mean", "inv_std"]),
    ((1, 2), 1, ["y", "mean", "inv_std"]),
    ((2,), -1, ["y", "", "inv_std"]),  # the rule adds the Mean output it reads
], ids=["all", "statistics", "inv-std-without-mean"])
def test_layer_normalization_statistics_are_differentiated(read, axis, outputs):
    """A loss reading LayerNormalization's Mean and InvStdDev gets their gradients in X's (ONNX
    Runtime, float32, against central differences in float64)."""
    rng = np.random.default_rng(3)
    x, scale = rng.normal(1.0, 2.0, (2, 3, 4)), rng.uniform(0.5, 2.0, (2, 3, 4)[axis:])
    weights = [rng.normal(0, 1, shape) for shape in ((2, 3, 4), *[(2, 3, 4)[:axis % 3] + (1,) * (3 - axis % 3)] * 2)]
    names = ["y", "mean", "inv_std"]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (("x", x), ("scale", scale))]
    inits += [numpy_helper.from_array(weights[k].astype(np.float32), f"R{k}") for k in read]
    nodes = [helper.make_node("LayerNormalization", ["x", "scale"], outputs, axis=axis, epsilon=1e-3)]
    for k in read:
        nodes += [helper.make_node("Mul", [names[k], f"R{k}"], [f"weighted{k}"]),
                  helper.make_node("ReduceSum", [f"weighted{k}"], [f"term{k}"], keepdims=0)]
    nodes.append(helper.make_node("Sum", [f"term{k}" for k in read], ["loss"]))
    graph = helper.make_graph(nodes, "ln", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    grad = gradient_model(model, "loss", ["x"])
    onnx.checker.check_model(grad, full_check=True)

    def loss(x):
        values = _layer_norm(x, scale, axis % 3, 1e-3)
        return float(sum(np.sum(values[k] * weights[k]) for k in read))

    assert_close(ort_run(grad, {}, ["x_grad"]), _central_differences(loss, {"x": x}), 2e-3, 1e-4, "LayerNormalization")


def test_float16_batch_norm_sums_its_gradients_in_float32():
    """An inference BatchNormalization of a float16 input with float32 scale, B, mean and var: the
    gradients of those are sums over N and the spatial axes, here past float16's 65504, which a
    float16 ReduceSum would hold as inf (ONNX Runtime's CPU provider computes one in float32, so
    the graph is inspected too); LayerNormalization's float32 Mean gives them finite."""
    shape = (2, 3, 16, 16)
    rng = np.random.default_rng(4)
    params = {"scale": rng.uniform(0.5, 2, 3), "B": rng.normal(0, 1, 3), "mean": rng.normal(0, 1, 3),
              "var": rng.uniform(0.5, 2, 3)}
    x, weight = rng.normal(0, 1, shape).astype(np.float16), np.full(shape, 200.0, np.float16)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(weight, "R")]
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    nodes = [helper.make_node("BatchNormalization", ["x", *params], ["y"]),
             helper.make_node("Mul", ["y", "R"], ["terms"]),
             helper.make_node("ReduceSum", ["terms"], ["loss16"], keepdims=0),
             helper.make_node("Cast", ["loss16"], ["loss"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bn", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    grad = gradient_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                          "loss", ["scale", "B", "mean", "var"])
    inferred = onnx.shape_inference.infer_shapes(grad)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    assert "LayerNormalization" in _ops(grad)
    assert not [n.name for n in grad.graph.node if n.name.startswith("grad_") and n.op_type == "ReduceSum"
                and types.get(n.input[0]) == TensorProto.FLOAT16]
    got = ort_run(grad, {}, [f"{k}_grad" for k in params])
    x64, axes = x.astype(np.float64), (0, 2, 3)
    inv_std = 1 / np.sqrt(params["var"] + 1e-5)
    x_hat = (x64 - params["mean"][:, None, None]) * inv_std[:, None, None]
    total, total_x_hat = weight.astype(np.float64).sum(axes), (weight * x_hat).sum(axes)
    want = {"scale_grad": total_x_hat, "B_grad": total, "mean_grad": -params["scale"] * inv_std * total,
            "var_grad": -0.5 * params["scale"] * inv_std**2 * total_x_hat}
    assert total.max() > 65504
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=2e-3, atol=2e-3 * np.abs(expected).max(), err_msg=name)


# -- the mixed-precision step -----------------------------------------------------------------------
N, C_IN, C, C_OUT, H, W = 4, 2, 3, 5, 6, 6


def _cnn() -> onnx.ModelProto:
    """x[N,2,6,6] -> Conv(3) -> BatchNormalization -> Relu -> Conv(5) -> y. The second Conv keeps the
    block inside the float16 region: the output is float32 (keep_io_types), and where the block
    ends the model the rewrite may put that cast before the BatchNormalization, whose per-channel
    inputs a float16 one would need cast too."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.normal(0, 0.5, (C, C_IN, 3, 3))), ("gamma", rng.uniform(0.5, 2, C)), ("beta", rng.normal(0, 0.3, C)),
        ("mean", np.zeros(C)), ("var", np.ones(C)), ("w2", rng.normal(0, 0.5, (C_OUT, C, 3, 3))))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], momentum=0.8),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, C_IN, H, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, C_OUT, H, W])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _float16_step(formulation: str, monkeypatch, loss_scale=None):
    monkeypatch.setattr(batch_statistics, "FORMULATION", formulation)
    return build(_cnn(), loss="mse", output="y", precision="float16", optimizer="sgd", loss_scale=loss_scale)


def _trained(step, steps: int = 5) -> tuple[list, dict[str, np.ndarray]]:
    rng = np.random.default_rng(6)
    trainer = Trainer(step, lr=0.1)
    results = [trainer.step({"x": rng.normal(1, 2, (N, C_IN, H, W)).astype(np.float32),
                             "labels": rng.normal(0, 1, (N, C_OUT, H, W)).astype(np.float32)}) for _ in range(steps)]
    return results, {k: trainer.value(k) for k in ("w", "gamma", "beta", "w2", "mean", "var")}


def _assert_same_training(scale, monkeypatch) -> None:
    runs = {f: _trained(_float16_step(f, monkeypatch, scale)) for f in FORMULATIONS}
    (old, old_weights), (new, new_weights) = runs["decomposed"], runs["layer-norm"]
    assert [r.skipped for r in new] == [r.skipped for r in old]
    np.testing.assert_allclose([r.loss for r in new], [r.loss for r in old], rtol=2e-3)
    for name, want in old_weights.items():
        np.testing.assert_allclose(new_weights[name], want, rtol=0, atol=2e-3 * np.abs(want).max(), err_msg=name)


def test_float16_step_trains_as_the_decomposition_does(monkeypatch):
    """Five SGD steps of the float16 step, at a loss scale under which neither formulation's
    gradients overflow: the same losses, weights and running statistics within float16's
    rounding."""
    _assert_same_training(LossScale(init=2.0**10), monkeypatch)


def test_float16_step_trains_as_the_decomposition_does_at_the_default_loss_scale(monkeypatch):
    """The per-channel gradients stay float32 (the Cast rule takes a rule's uncast value), so
    at the default scale they overflow no more than the decomposition's."""
    _assert_same_training(None, monkeypatch)


def test_float16_step_makes_no_float32_tensor_shaped_like_the_activation(monkeypatch):
    """Structure of the float16 step: every value onnx's shape inference types float32 and shapes
    [N, C, H, W] (the BatchNormalization's activation; the model's input, labels and output have
    other channel counts) is listed, forward and backward. The decomposition makes several (its
    reductions are float32, so its centred input, square and output are, and their gradients);
    the layer-norm formulation makes none: LayerNormalization and BatchNormalization read the
    float16 Conv output, and its gradient's sums are LayerNormalization means."""
    activation = [N, C, H, W]
    found = {}
    for formulation in FORMULATIONS:
        model = onnx.shape_inference.infer_shapes(_float16_step(formulation, monkeypatch).model)
        values = [*model.graph.value_info, *model.graph.input, *model.graph.output]
        found[formulation] = [v.name for v in values if v.type.tensor_type.elem_type == TensorProto.FLOAT
                              and [d.dim_value for d in v.type.tensor_type.shape.dim] == activation]
        types = {v.name: v.type.tensor_type.elem_type for v in values}
        if formulation == "layer-norm":
            norms = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "BatchNormalization")]
            assert len(norms) == 4  # the forward's two; the backward's means of g and g * x_hat
            assert all(types[n.input[0]] == TensorProto.FLOAT16 for n in norms)
            bn = next(n for n in norms if n.op_type == "BatchNormalization")
            assert all(types[name] == TensorProto.FLOAT16 for name in bn.input), "CUDA's kernel takes X's type"
    assert len(found["decomposed"]) >= 4, found["decomposed"]
    assert found["layer-norm"] == []


def _pooled_cnn() -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> GlobalAveragePool -> Flatten -> Gemm -> logits (the seed
    CNN's last block: its BatchNormalization is read by the pool alone)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(1, 0.1, 6).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(0, 0.1, 6).astype(np.float32), "beta"),
             numpy_helper.from_array(np.zeros(6, np.float32), "mean"),
             numpy_helper.from_array(np.ones(6, np.float32), "var"),
             numpy_helper.from_array(rng.normal(0, 0.3, (6, 4)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"]),
             helper.make_node("GlobalAveragePool", ["n"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_batch_normalization_read_only_by_a_pool_is_never_made_and_trains_the_same(monkeypatch):
    """The pool of the normalised activation is made from the per-(n, c) means: no
    BatchNormalization or pool of the activation in the step, the same training as the
    decomposition (float32, five SGD steps)."""
    model = _pooled_cnn()
    rng = np.random.default_rng(4)
    batches = [{"x": rng.normal(0.5, 2, (8, 3, 8, 8)).astype(np.float32),
                "labels": rng.normal(0, 1, (8, 4)).astype(np.float32)} for _ in range(5)]
    trained = {}
    for formulation in FORMULATIONS:
        monkeypatch.setattr(batch_statistics, "FORMULATION", formulation)
        step = build(model, loss="mse", output="logits", precision="float32", optimizer="sgd",
                     batchnorm="train")
        ops = [n.op_type for n in step.model.graph.node]
        if formulation == "layer-norm":
            assert "BatchNormalization" not in ops
            pools = [n for n in step.model.graph.node if n.op_type == "GlobalAveragePool"]
            assert all(n.input[0] != "n" and n.output[0] != "p" for n in pools)
        trainer = Trainer(step, lr=0.1)
        trained[formulation] = ([trainer.step(batch).loss for batch in batches],
                                {k: trainer.value(k) for k in ("w", "gamma", "beta", "fc", "mean", "var")})
    (old_losses, old), (new_losses, new) = trained["decomposed"], trained["layer-norm"]
    np.testing.assert_allclose(new_losses, old_losses, rtol=1e-5)
    for name in old:
        np.testing.assert_allclose(new[name], old[name], rtol=1e-4, atol=1e-6, err_msg=name)
