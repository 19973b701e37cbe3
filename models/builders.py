"""Builders for the sample and test models (no binaries are committed).

Every builder returns an ``onnx.ModelProto`` with float32 weights drawn from a
seeded generator, so the same call always gives the same bytes.
``save_with_external_data`` writes any of them with its weights beside it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FLOAT = TensorProto.FLOAT


class _Graph:
    """A tiny graph builder: names values, collects nodes and initializers."""

    def __init__(self, seed: int = 0, placeholder_weights: bool = False) -> None:
        self.placeholder_weights = placeholder_weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def const(self, array: np.ndarray, hint: str = "w") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        std = scale if scale is not None else 1.0 / math.sqrt(max(fan_in, 1))
        if self.placeholder_weights and len(shape) == 2:
            name = self.name("w")
            placeholder = TensorProto(name=name, data_type=FLOAT)
            placeholder.dims.extend(shape)
            self.initializers.append(placeholder)
            return name
        return self.const((self.rng.standard_normal(shape) * std).astype(np.float32))

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, dtype=np.float32), "c")

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64), "shape")

    def model(self, name, inputs, outputs, opset: int = OPSET) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="amp-rewrite-models"
        )
        model.ir_version = 8
        return model


def _tensor(name: str, shape, elem_type=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def seed_cnn(image_size: int = 256, batch: int | str = "batch", classes: int = 10) -> onnx.ModelProto:
    """The seed experiment's CNN (BACKGROUND.md): two conv blocks, GAP, dense, softmax."""
    g = _Graph(seed=1)
    x = "image"
    for channels_in, channels_out, kernel in ((3, 64, 7), (64, 128, 11)):
        conv = g.op(
            "Conv", [x, g.weight(channels_out, channels_in, kernel, kernel), g.weight(channels_out, scale=0.1)],
            strides=[2, 2], auto_pad="SAME_UPPER",
        )
        act = g.op("Relu", [conv])
        ones = np.ones(channels_out, np.float32)
        x = g.op(
            "BatchNormalization",
            [act, g.const(ones * 1.1), g.const(ones * 0.05), g.const(ones * 0.2), g.const(ones * 0.9)],
            epsilon=1e-3,
        )
    pooled = g.op("GlobalAveragePool", [x])
    flat = g.op("Flatten", [pooled], axis=1)
    logits = g.op("Gemm", [flat, g.weight(128, classes), g.weight(classes, scale=0.1)])
    g.nodes.append(helper.make_node("Softmax", [logits], ["probabilities"], axis=-1, name="softmax"))
    return g.model(
        "seed_cnn",
        [_tensor("image", [batch, 3, image_size, image_size])],
        [_tensor("probabilities", [batch, classes])],
    )


def mlp(features: int = 64, hidden: int = 128, classes: int = 10, layers: int = 3) -> onnx.ModelProto:
    """Gemm/MatMul layers with ReLU and a LogSoftmax head."""
    g = _Graph(seed=2)
    x, width = "x", features
    for i in range(layers):
        if i % 2 == 0:
            x = g.op("Gemm", [x, g.weight(width, hidden), g.weight(hidden, scale=0.1)])
        else:
            x = g.op("Add", [g.op("MatMul", [x, g.weight(width, hidden)]), g.weight(hidden, scale=0.1)])
        x, width = g.op("Relu", [x]), hidden
    logits = g.op("MatMul", [x, g.weight(width, classes)])
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], axis=-1, name="log_softmax"))
    return g.model("mlp", [_tensor("x", ["batch", features])], [_tensor("log_probs", ["batch", classes])])


def _layer_norm(g: _Graph, x: str, width: int, fused: bool) -> str:
    scale, bias = g.const(np.ones(width, np.float32)), g.const(np.zeros(width, np.float32))
    if fused:
        return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)
    mean = g.op("ReduceMean", [x], axes=[-1])
    centered = g.op("Sub", [x, mean])
    variance = g.op("ReduceMean", [g.op("Pow", [centered, g.scalar(2.0)])], axes=[-1])
    std = g.op("Sqrt", [g.op("Add", [variance, g.scalar(1e-5)])])
    return g.op("Add", [g.op("Mul", [g.op("Div", [centered, std]), scale]), bias])


def _gelu_erf(g: _Graph, x: str) -> str:
    erf = g.op("Erf", [g.op("Div", [x, g.scalar(math.sqrt(2.0))])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.scalar(1.0)])]), g.scalar(0.5)])


def _encoder_block(g: _Graph, x: str, width: int, heads: int, mask: str | None, fused_ln: bool) -> str:
    head_dim = width // heads
    split_heads = g.ints(0, -1, heads, head_dim)

    def project_heads(source: str) -> str:
        projected = g.op("Add", [g.op("MatMul", [source, g.weight(width, width)]), g.weight(width, scale=0.02)])
        return g.op("Transpose", [g.op("Reshape", [projected, split_heads])], perm=[0, 2, 1, 3])

    q, k, v = project_heads(x), project_heads(x), project_heads(x)
    kt = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = g.op("Div", [g.op("MatMul", [q, kt]), g.scalar(math.sqrt(head_dim))])
    if mask is not None:
        scores = g.op("Add", [scores, mask])
    attn = g.op("Softmax", [scores], axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
    merged = g.op("Reshape", [context, g.ints(0, -1, width)])
    out = g.op("Add", [g.op("MatMul", [merged, g.weight(width, width)]), g.weight(width, scale=0.02)])
    x = _layer_norm(g, g.op("Add", [x, out]), width, fused_ln)
    hidden = g.op("Add", [g.op("MatMul", [x, g.weight(width, 4 * width)]), g.weight(4 * width, scale=0.02)])
    ffn = g.op("Add", [g.op("MatMul", [_gelu_erf(g, hidden), g.weight(4 * width, width)]), g.weight(width, scale=0.02)])
    return _layer_norm(g, g.op("Add", [x, ffn]), width, fused_ln)


def transformer(
    blocks: int = 1,
    width: int = 64,
    heads: int = 4,
    seq: int | str = "seq",
    with_mask: bool = False,
    expose_blocks: bool = False,
    fused_layer_norm: bool = True,
    seed: int = 3,
    placeholder_weights: bool = False,
) -> onnx.ModelProto:
    """A stack of transformer encoder blocks (attention, LayerNorm, Erf GELU, residuals).

    ``with_mask`` feeds one float additive mask input to every block, and
    ``expose_blocks`` makes every block's output a graph output: the shape of
    graph that makes some converters quadratic. ``placeholder_weights`` leaves
    the matrices without data, for a writer that streams them to external data.
    """
    g = _Graph(seed=seed, placeholder_weights=placeholder_weights)
    x = "hidden_in"
    mask = "mask" if with_mask else None
    outputs = []
    for _ in range(blocks):
        x = _encoder_block(g, x, width, heads, mask, fused_layer_norm)
        if expose_blocks:
            outputs.append(_tensor(x, ["batch", seq, width]))
    g.nodes.append(helper.make_node("Identity", [x], ["hidden_out"], name="output"))
    outputs.append(_tensor("hidden_out", ["batch", seq, width]))
    inputs = [_tensor("hidden_in", ["batch", seq, width])]
    if with_mask:
        inputs.append(_tensor("mask", ["batch", 1, seq, seq]))
    return g.model("transformer", inputs, outputs)


def control_flow(width: int = 16) -> onnx.ModelProto:
    """If and Loop subgraphs whose bodies compute on a tensor captured from the outer graph."""
    g = _Graph(seed=4)
    projected = g.op("MatMul", ["x", g.weight(width, width)])
    weight = g.weight(width, width)

    then_branch = helper.make_graph(
        [helper.make_node("MatMul", [projected, weight], ["then_mm"], name="then_matmul"),
         helper.make_node("Relu", ["then_mm"], ["then_out"], name="then_relu")],
        "then_branch", [], [_tensor("then_out", None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Softmax", [projected], ["else_out"], axis=-1, name="else_softmax")],
        "else_branch", [], [_tensor("else_out", None)],
    )
    branched = g.op("If", ["use_matmul"], then_branch=then_branch, else_branch=else_branch)

    body = helper.make_graph(
        [helper.make_node("MatMul", ["carried", weight], ["body_mm"], name="body_matmul"),
         helper.make_node("Tanh", ["body_mm"], ["body_tanh"], name="body_tanh"),
         helper.make_node("Add", ["body_tanh", projected], ["carried_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [_tensor("iteration", [], TensorProto.INT64), _tensor("cond_in", [], TensorProto.BOOL),
         _tensor("carried", ["batch", width])],
        [_tensor("cond_out", [], TensorProto.BOOL), _tensor("carried_out", ["batch", width])],
    )
    looped = g.op("Loop", [g.const(np.array(3, np.int64), "trips"), "", branched], body=body)
    g.nodes.append(helper.make_node("Add", [looped, projected], ["y"], name="final_add"))
    return g.model(
        "control_flow",
        [_tensor("x", ["batch", width]), _tensor("use_matmul", [], TensorProto.BOOL)],
        [_tensor("y", ["batch", width])],
    )


def dynamic_batch(features: int = 32) -> onnx.ModelProto:
    """An MLP whose batch dimension is symbolic, reshaped through a Shape-computed target."""
    g = _Graph(seed=5)
    h = g.op("Relu", [g.op("Gemm", ["x", g.weight(features, features), g.weight(features, scale=0.1)])])
    batch_dim = g.op("Gather", [g.op("Shape", [h]), g.const(np.array([0], np.int64), "idx")], axis=0)
    target = g.op("Concat", [batch_dim, g.ints(4, features // 4)], axis=0)
    grouped = g.op("Reshape", [h, target])
    g.nodes.append(helper.make_node("ReduceMax", [grouped], ["y"], axes=[2], keepdims=0, name="reduce_max"))
    return g.model("dynamic_batch", [_tensor("x", ["N", features])], [_tensor("y", ["N", 4])])


SAMPLES = {
    "seed_cnn": lambda: seed_cnn(image_size=64),
    "mlp": mlp,
    "transformer": transformer,
    "control_flow": control_flow,
    "dynamic_batch": dynamic_batch,
}


def save_with_external_data(model: onnx.ModelProto, path: str | os.PathLike, location: str | None = None) -> str:
    """Save ``model`` with every initializer of 1 KiB or more in one external data file."""
    path = os.fspath(path)
    onnx.save_model(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True,
        location=location or os.path.basename(path) + ".data", size_threshold=1024,
    )
    return path


def large_transformer(path: str | os.PathLike, target_bytes: int, width: int = 2048, seed: int = 7) -> str:
    """Write a transformer with at least ``target_bytes`` of float32 weights, as external data.

    Weights are streamed to the data file one tensor at a time, so building a
    model over 2 GB needs memory for one tensor, not for the model.
    """
    path = os.fspath(path)
    per_block = 4 * (4 * width * width + 2 * 4 * width * width)
    proto = transformer(blocks=max(1, -(-target_bytes // per_block)), width=width, heads=16, seed=seed,
                        placeholder_weights=True)
    location = os.path.basename(path) + ".data"
    rng = np.random.default_rng(seed)
    with open(os.path.join(os.path.dirname(path) or ".", location), "wb") as data:
        for tensor in _big_tensors(proto):
            shape = tuple(tensor.dims)
            values = (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[0])).astype(np.float32)
            offset = data.tell()
            data.write(values.tobytes())
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(values.nbytes))):
                tensor.external_data.add(key=key, value=value)
    onnx.save_model(proto, path)
    return path


def _big_tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for tensor in proto.graph.initializer:
        if len(tensor.dims) == 2 and not tensor.raw_data:
            yield tensor


def _from_text(text: str, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {OPSET}]>\nfragile {text}')
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n) for n, a in weights.items())
    return model


def fragile_layer_norm() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A decomposed LayerNorm whose sum of squares overflows float16 on its sample (|x| ~ 200)."""
    rng = np.random.default_rng(1)
    model = _from_text("""(float[8,64] x) => (float[8,64] y) {
      [mm] h = MatMul(x, w)
      [mean] mu = ReduceMean<axes=[-1]>(h)
      [center] d = Sub(h, mu)
      [square] sq = Mul(d, d)
      [var] v = ReduceMean<axes=[-1]>(sq)
      [eps] ve = Add(v, eps)
      [sqrt] s = Sqrt(ve)
      [norm] n = Div(d, s)
      [proj] y = MatMul(n, w2)
    }""", {"w": rng.standard_normal((64, 64)).astype(np.float32) * 0.2, "eps": np.array(1e-5, np.float32),
           "w2": rng.standard_normal((64, 64)).astype(np.float32) * 0.1})
    return model, {"x": (np.random.default_rng(2).standard_normal((8, 64)) * 200).astype(np.float32)}


def fragile_log_softmax() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Softmax probabilities under 6e-8 (they flush to zero in float16) fed to a Log."""
    rng = np.random.default_rng(3)
    model = _from_text("""(float[4,32] x) => (float[4,32] y) {
      [mm1] h = MatMul(x, w1)
      [relu] a = Relu(h)
      [mm2] logits = MatMul(a, w2)
      [scale] z = Mul(logits, k)
      [softmax] p = Softmax<axis=-1>(z)
      [log] y = Log(p)
    }""", {"w1": rng.standard_normal((32, 32)).astype(np.float32),
           "w2": rng.standard_normal((32, 32)).astype(np.float32), "k": np.array(0.5, np.float32)})
    return model, {"x": (np.random.default_rng(4).standard_normal((4, 32)) * 3).astype(np.float32)}


def cancellation() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """(x + 1000) - 1000: values fit float16, but its spacing at 1000 (0.5) erases x."""
    model = _from_text("""(float[8,64] x) => (float[8,64] y) {
      [shift] a = Add(x, big)
      [unshift] b = Sub(a, big)
      [proj] y = MatMul(b, w)
    }""", {"big": np.array(1000, np.float32),
           "w": np.random.default_rng(6).standard_normal((64, 64)).astype(np.float32) * 0.1})
    return model, {"x": np.random.default_rng(7).standard_normal((8, 64)).astype(np.float32)}


FRAGILE = {"fragile_layer_norm": fragile_layer_norm, "fragile_log_softmax": fragile_log_softmax,
           "cancellation": cancellation}
"""Models that break in float16 when every node runs low, each with a sample that shows it."""
