"""ONNX Runtime's fused transformer ops (com.microsoft EmbedLayerNormalization, Attention,
SkipLayerNormalization, the Gelus...) unfuse into standard ops that compute what ONNX Runtime's CPU
kernels compute, keep every output and initializer name, and differentiate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.lowerings.unfused import MS, unfused
from amp_rewrite.errors import UserError
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

B, S, D, HEADS = 2, 5, 8, 2
"""Batch, sequence, hidden size, attention heads."""
FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
           outputs: dict[str, tuple[int, ...]], opset: int = 17) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of ``nodes`` with ``inputs`` (fed as given), ``weights`` as initializers and ``outputs``
    (name: shape; int32 for the mask_index, float otherwise); its feeds."""
    elem = {np.dtype(np.float32): FLOAT, np.dtype(np.int32): INT32}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, elem[a.dtype], a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, INT32 if n == "mask_index" else FLOAT, dims) for n, dims in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    return model, inputs


def _normal(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng(seed).normal(0, scale, shape).astype(np.float32)


def _ms(op: str, inputs: list[str], outputs: list[str], **attributes) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=op.lower(), domain=MS, **attributes)


MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)


def _embed(segments: bool = True, mask: bool = True, position_ids: bool = False,
           read: tuple[str, ...] = ("embedded", "mask_index", "embedding_sum"), opset: int = 17):
    """EmbedLayerNormalization into embedded, mask_index and embedding_sum; the graph's outputs: ``read``."""
    ids = rng(1).integers(0, 16, (B, S)).astype(np.int32)
    inputs = {"ids": ids, **({"segments": (ids % 2).astype(np.int32)} if segments else {}),
              **({"mask": MASK} if mask else {}),
              **({"position_ids": np.array([[4, 3, 2, 1, 0]] * B, np.int32)} if position_ids else {})}
    weights = {"words": _normal(2, 16, D), "positions": _normal(3, S + 3, D),
               **({"segment_table": _normal(4, 2, D)} if segments else {}),
               "gamma": _normal(5, D), "beta": _normal(6, D)}
    node = _ms("EmbedLayerNormalization",
               ["ids", "segments" if segments else "", "words", "positions", "segment_table" if segments else "",
                "gamma", "beta", "mask" if mask else "", *(["position_ids"] if position_ids else [])],
               ["embedded", "mask_index", "embedding_sum"], epsilon=1e-5)
    shapes = {"embedded": (B, S, D), "mask_index": (B,), "embedding_sum": (B, S, D)}
    return _model([node], inputs, weights, {o: shapes[o] for o in read}, opset)


def _attention(mask: np.ndarray | None = None, sizes: tuple[int, int, int] = (D, D, D), bias: bool = True,
               attention_bias: bool = False, present: bool = False, opset: int = 17, **attributes):
    inputs = {"x": _normal(1, B, S, D), **({"mask_index": mask} if mask is not None else {}),
              **({"attention_bias": _normal(7, 1, HEADS, S, S)} if attention_bias else {})}
    weights = {"qkv_weight": _normal(2, D, sum(sizes), scale=0.5), **({"qkv_bias": _normal(3, sum(sizes))}
                                                                       if bias else {})}
    if sizes != (D, D, D):
        attributes["qkv_hidden_sizes"] = list(sizes)
    node = _ms("Attention", ["x", "qkv_weight", "qkv_bias" if bias else "", "mask_index" if mask is not None else "",
                             "", "attention_bias" if attention_bias else ""],
               ["context", *(["present"] if present else [])], num_heads=HEADS, **attributes)
    shapes = {"context": (B, S, sizes[2]), "present": (2, B, HEADS, S, D // HEADS)}
    return _model([node], inputs, weights, {o: shapes[o] for o in node.output}, opset)


def _skip_norm(op: str = "SkipLayerNormalization", beta: bool = True, bias: bool = True, sum_output: bool = True,
               opset: int = 17):
    simplified = op == "SkipSimplifiedLayerNormalization"
    inputs = {"x": _normal(1, B, S, D), "skip": _normal(2, B, S, D)}
    weights = {"gamma": _normal(3, D), **({"beta": _normal(4, D)} if beta and not simplified else {}),
               **({"bias": _normal(5, D)} if bias else {})}
    names = ["x", "skip", "gamma", *([] if simplified else ["beta" if beta else ""]), "bias" if bias else ""]
    outputs = ["normed", "", "", "sum"] if sum_output else ["normed"]
    node = _ms(op, names, outputs, epsilon=1e-5)
    return _model([node], inputs, weights, {o: (B, S, D) for o in outputs if o}, opset)


def _simplified_norm(opset: int = 17):
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["normed"], name="rms", epsilon=1e-6)
    return _model([node], {"x": _normal(1, B, S, D)}, {"gamma": _normal(2, D)}, {"normed": (B, S, D)}, opset)


def _unary(op: str, bias: bool = False, skip: bool = False, **attributes):
    inputs = {"x": _normal(1, B, S, D, scale=2.0), **({"skip": _normal(2, B, S, D)} if skip else {})}
    weights = {"bias": _normal(3, D)} if bias else {}
    names = ["x", *(["bias"] if bias else []), *(["skip"] if skip else [])]
    return _model([_ms(op, names, ["y"], **attributes)], inputs, weights, {"y": (B, S, D)})


CASES = {
    "embed": _embed,
    "embed without segments or mask, mask_index read": lambda: _embed(segments=False, mask=False),
    "embed with position_ids": lambda: _embed(position_ids=True),
    "embed, secondary outputs unread": lambda: _embed(read=("embedded",)),
    "embed at opset 12": lambda: _embed(opset=12),
    "attention without mask": _attention,
    "attention, 2-D 0/1 mask": lambda: _attention(MASK),
    "attention, 3-D mask": lambda: _attention(np.tril(np.ones((S, S), np.int32))[None].repeat(B, 0)),
    "attention, 1-D end positions": lambda: _attention(np.array([3, 5], np.int32)),
    "attention, 1-D end and start positions": lambda: _attention(np.array([4, 5, 1, 0], np.int32)),
    "attention, attention_bias and mask": lambda: _attention(MASK, attention_bias=True),
    "attention, scale and mask_filter_value": lambda: _attention(MASK, scale=0.3, mask_filter_value=-500.0),
    "attention, qkv_hidden_sizes": lambda: _attention(sizes=(D, D, 4)),
    "attention, present read": lambda: _attention(MASK, present=True),
    "attention at opset 12": lambda: _attention(MASK, opset=12),
    "skip layer norm": _skip_norm,
    "skip layer norm without beta or bias": lambda: _skip_norm(beta=False, bias=False, sum_output=False),
    "skip layer norm at opset 13": lambda: _skip_norm(opset=13),
    "skip simplified layer norm": lambda: _skip_norm("SkipSimplifiedLayerNormalization"),
    "simplified layer norm": _simplified_norm,
    "bias gelu": lambda: _unary("BiasGelu", bias=True),
    "gelu": lambda: _unary("Gelu"),
    "fast gelu": lambda: _unary("FastGelu"),
    "fast gelu with bias": lambda: _unary("FastGelu", bias=True),
    "quick gelu": lambda: _unary("QuickGelu", alpha=1.5),
}


def _unfused_copy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    return copy, unfused(copy)


def _assert_same_outputs(model: onnx.ModelProto, low: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    names = [o.name for o in model.graph.output]
    want, got = ort_run(model, feeds, names), ort_run(low, feeds, names)
    for name in names:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_the_unfused_model_computes_what_onnx_runtime_computes(case) -> None:
    """Standard ops only, the checker's full check passes, the initializers are untouched, and every
    output equals the fused kernel's."""
    model, feeds = CASES[case]()
    low, notes = _unfused_copy(model)
    op = next(n.op_type for n in model.graph.node)
    assert notes == [f"unfused 1 ONNX Runtime fused op ({op} x1) into standard ops for differentiation"]
    assert not [n for n in low.graph.node if n.domain == MS or n.op_type == "SimplifiedLayerNormalization"]
    onnx.checker.check_model(low, full_check=True)
    assert [t.SerializeToString() for t in low.graph.initializer] == \
        [t.SerializeToString() for t in model.graph.initializer]
    assert all(n.name.startswith(model.graph.node[0].name + "/") for n in low.graph.node)
    _assert_same_outputs(model, low, feeds)


def test_ops_without_a_cpu_kernel_compute_their_definition() -> None:
    """GemmFastGelu is FastGelu(X W + bias) and BiasAdd is X + bias + skip (CUDA and ROCm kernels only)."""
    x, w, bias, skip = _normal(1, B, S, D), _normal(2, D, 2 * D), _normal(3, 2 * D), _normal(4, B, S, 2 * D)
    gemm, _ = _model([_ms("GemmFastGelu", ["x", "w", "bias"], ["y"])], {"x": x}, {"w": w, "bias": bias},
                     {"y": (B, S, 2 * D)})
    reference, _ = _model([helper.make_node("MatMul", ["x", "w"], ["xw"]), _ms("FastGelu", ["xw", "bias"], ["y"])],
                          {"x": x}, {"w": w, "bias": bias}, {"y": (B, S, 2 * D)})
    unfused(gemm)
    np.testing.assert_allclose(ort_run(gemm, {"x": x}, ["y"])["y"], ort_run(reference, {"x": x}, ["y"])["y"],
                               rtol=1e-5, atol=2e-6)
    add, _ = _model([_ms("BiasAdd", ["xw", "bias", "skip"], ["y"])], {"xw": x @ w, "skip": skip}, {"bias": bias},
                    {"y": (B, S, 2 * D)})
    unfused(add)
    np.testing.assert_allclose(ort_run(add, {"xw": x @ w, "skip": skip}, ["y"])["y"], x @ w + bias + skip, rtol=1e-6)


def test_attention_without_bias_is_attention_with_a_zero_bias() -> None:
    """ONNX Runtime's CPU kernel takes no Attention without its bias (it crashes): the unfused form
    of one without is compared with the kernel given zeros."""
    model, feeds = _attention(bias=False)
    zero_bias, _ = _attention()
    zero_bias.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(3 * D, np.float32), "qkv_bias"))
    unfused(model)
    assert "qkv_bias" not in {i for n in model.graph.node for i in n.input}
    np.testing.assert_allclose(ort_run(model, feeds, ["context"])["context"],
                               ort_run(zero_bias, feeds, ["context"])["context"], rtol=1e-5, atol=2e-6)


def test_layer_norms_use_layer_normalization_from_opset_17_and_reductions_before() -> None:
    for opset, want in ((17, {"LayerNormalization"}), (13, {"ReduceMean", "Sqrt"})):
        low, _ = _unfused_copy(_skip_norm(opset=opset)[0])
        ops = {n.op_type for n in low.graph.node}
        assert want <= ops and ("ReduceMean" in ops) == (opset < 17), opset


def test_the_mask_filter_reaches_the_scores_where_the_mask_is_zero() -> None:
    """The cases above compare something: a mask changes the kernel's outputs."""
    masked, feeds = _attention(MASK)
    plain, _ = _attention()
    assert not np.allclose(ort_run(masked, feeds, ["context"])["context"],
                           ort_run(plain, {"x": feeds["x"]}, ["context"])["context"])


def test_unread_secondary_outputs_are_dropped_with_their_value_info() -> None:
    model, _ = _embed(read=("embedded", "mask_index"))
    model.graph.value_info.append(helper.make_tensor_value_info("embedding_sum", FLOAT, [B, S, D]))
    low, _ = _unfused_copy(model)
    made = {o for n in low.graph.node for o in n.output}
    assert {"embedded", "mask_index"} <= made and "embedding_sum" not in made
    assert not [vi for vi in low.graph.value_info if vi.name == "embedding_sum"]


def _chain(opset: int = 17):
    """Two layers as ONNX Runtime's optimizer fuses BERT: EmbedLayerNormalization (its mask_index
    read by both layers' Attention) -> Attention -> MatMul -> SkipLayerNormalization -> MatMul ->
    BiasGelu -> MatMul -> SkipLayerNormalization, twice."""
    model, feeds = _embed(read=(), opset=opset)
    model.graph.node[0].output[0] = "h0"
    weights: dict[str, np.ndarray] = {}

    def param(layer: int, name: str, *shape: int) -> str:
        weights[f"l{layer}.{name}"] = _normal(10 + len(weights), *shape, scale=0.5)
        return f"l{layer}.{name}"

    for i in range(2):
        h, a, p, n, u, g, d = (f"{v}{i}" for v in "hapnugd")
        model.graph.node.extend([
            _ms("Attention", [h, param(i, "qkv", D, 3 * D), param(i, "qkv_bias", 3 * D), "mask_index"], [a],
                num_heads=HEADS),
            helper.make_node("MatMul", [a, param(i, "proj", D, D)], [p]),
            _ms("SkipLayerNormalization", [p, h, param(i, "g1", D), param(i, "b1", D)], [n]),
            helper.make_node("MatMul", [n, param(i, "up", D, 2 * D)], [u]),
            _ms("BiasGelu", [u, param(i, "up_bias", 2 * D)], [g]),
            helper.make_node("MatMul", [g, param(i, "down", 2 * D, D)], [d]),
            _ms("SkipLayerNormalization", [d, n, param(i, "g2", D), param(i, "b2", D)], [f"h{i + 1}"]),
        ])
        for node in model.graph.node[-7:]:
            node.name = f"{node.op_type.lower()}{i}_{len(model.graph.node)}_{node.output[0]}"
    model.graph.initializer.extend(numpy_helper.from_array(w, name) for name, w in weights.items())
    model.graph.output.append(helper.make_tensor_value_info("h2", FLOAT, [B, S, D]))
    return model, feeds


@pytest.mark.parametrize("opset", [17, 13])
def test_a_fused_two_layer_encoder_unfuses_to_the_same_outputs(opset: int) -> None:
    model, feeds = _chain(opset)
    low, notes = _unfused_copy(model)
    assert notes == ["unfused 9 ONNX Runtime fused ops (Attention x2, BiasGelu x2, EmbedLayerNormalization x1, "
                     "SkipLayerNormalization x4) into standard ops for differentiation"]
    onnx.checker.check_model(low, full_check=True)
    assert [t.name for t in low.graph.initializer] == [t.name for t in model.graph.initializer]
    # one additive mask, shared by both layers; from mask_index's counts, which have no start positions
    assert [n.op_type for n in low.graph.node].count("Where") == 1 and "Not" not in {n.op_type for n in low.graph.node}
    _assert_same_outputs(model, low, feeds)
    # mask_index counts a row's ones, wherever they are: the first 3 keys of row 0 are attended
    _assert_same_outputs(model, low, {**feeds, "mask": np.array([[0, 1, 1, 0, 1], [1] * S], np.int32)})


@pytest.mark.parametrize("opset", [17, 13])
def test_the_unfused_encoder_has_gradients_that_match_finite_differences(opset: int) -> None:
    model, feeds = _chain(opset)
    unfused(model)
    wrt = ["words", "l0.qkv", "l0.qkv_bias", "l1.up_bias", "l1.g2"]
    directional_check(with_loss(model, feeds), feeds, wrt)


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_a_fused_encoder_trains_and_its_weights_go_back_into_the_fused_model_by_name(precision: str) -> None:
    """The step unfuses by itself (``differentiable``), leaving the given model as it was."""
    from amp_rewrite.training import build
    from amp_rewrite.training.runner.trainer import Trainer

    fused, feeds = _chain()
    given = fused.SerializeToString()
    step = build(fused, loss="mse", output="h2", precision=precision)
    assert fused.SerializeToString() == given
    trainer = Trainer(step, lr=1e-2)
    batch = {**feeds, "labels": _normal(9, B, S, D)}
    losses = [trainer.step(batch).loss for _ in range(20)]
    assert losses[-1] < 0.9 * losses[0]
    assert set(trainer.weights) <= {t.name for t in fused.graph.initializer}
    model = onnx.ModelProto.FromString(given)
    unfused(model)
    _assert_same_outputs(trainer.with_weights(fused), trainer.with_weights(model), feeds)


def test_nothing_to_unfuse_changes_nothing_and_a_second_run_is_a_no_op() -> None:
    model, _ = _chain()
    unfused(model)
    before = model.SerializeToString()
    assert unfused(model) == []
    assert model.SerializeToString() == before


def test_ops_it_does_not_know_stay_as_they_are() -> None:
    node = _ms("FusedMatMul", ["x", "w"], ["y"], alpha=0.5)
    model, _ = _model([node], {"x": _normal(1, B, D)}, {"w": _normal(2, D, D)}, {"y": (B, D)})
    before = model.SerializeToString()
    assert unfused(model) == []
    assert model.SerializeToString() == before


def test_a_model_importing_no_default_opset_gets_one() -> None:
    model, feeds = _unary("BiasGelu", bias=True)
    del model.opset_import[0]
    model.ir_version = 7
    low, notes = _unfused_copy(model)
    assert notes[1] == "imported default-domain opset 17 for the standard ops"
    assert low.ir_version >= 8
    onnx.checker.check_model(low, full_check=True)
    _assert_same_outputs(model, low, feeds)


REFUSED = {
    "causal": (lambda: _attention(unidirectional=1), "Attention node 'attention': it has a causal"),
    "rotary": (lambda: _attention(do_rotary=1), "it applies rotary embeddings"),
    "4-D mask": (lambda: _attention(np.ones((B, 1, S, S), np.int32)), "its mask_index has rank 4"),
    "mean read": (lambda: _model([_ms("SkipLayerNormalization", ["x", "x", "g"], ["y", "mean"])],
                                 {"x": _normal(1, B, S, D)}, {"g": _normal(2, D)}, {"y": (B, S, D), "mean": (B, S, 1)}),
                  "SkipLayerNormalization node 'skiplayernormalization': its output mean is read, which unfused "
                  "cannot rewrite into standard ops for differentiation"),
    "opset 10": (lambda: _model([_ms("Gelu", ["x"], ["y"])], {"x": _normal(1, B, D)}, {}, {"y": (B, D)}, opset=10),
                 "the model imports default-domain opset 10; unfusing its ONNX Runtime ops needs 11"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_forms_it_cannot_rewrite_are_refused_naming_the_node_and_the_model_is_left_as_it_was(case) -> None:
    make, message = REFUSED[case]
    model, _ = make()
    before = model.SerializeToString()
    with pytest.raises(UserError, match=message):
        unfused(model)
    assert model.SerializeToString() == before


def test_attention_with_past_state_is_refused() -> None:
    model, _ = _attention()
    model.graph.node[0].input[4] = "past"
    model.graph.input.append(helper.make_tensor_value_info("past", FLOAT, [2, B, HEADS, 3, D // HEADS]))
    with pytest.raises(UserError, match="it reads past state"):
        unfused(model)
