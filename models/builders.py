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

from amp_rewrite.ir.builder import GraphBuilder, Names

OPSET = 17
FLOAT = TensorProto.FLOAT


class _Graph(GraphBuilder):
    """``GraphBuilder`` nodes (unique names, element types), with weights and other constants as
    initializers drawn from a seeded generator (sample models keep their weights out of the graph)."""

    def __init__(self, seed: int = 0, placeholder_weights: bool = False) -> None:
        super().__init__(Names(), OPSET)
        self.placeholder_weights = placeholder_weights
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)

    def initializer(self, array: np.ndarray, hint: str = "w") -> str:
        name = self.names.fresh(hint)
        tensor = numpy_helper.from_array(np.asarray(array), name)
        self.initializers.append(tensor)
        self.types[name] = tensor.data_type
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        std = scale if scale is not None else 1.0 / math.sqrt(max(fan_in, 1))
        if self.placeholder_weights and len(shape) == 2:
            name = self.names.fresh("w")
            placeholder = TensorProto(name=name, data_type=FLOAT)
            placeholder.dims.extend(shape)
            self.initializers.append(placeholder)
            self.types[name] = FLOAT
            return name
        return self.initializer((self.rng.standard_normal(shape) * std).astype(np.float32))

    def scalar(self, value: float) -> str:
        return self.initializer(np.array(value, dtype=np.float32), "c")

    def dims(self, *values: int) -> str:
        """A 1-D int64 initializer (a Reshape target)."""
        return self.initializer(np.array(values, dtype=np.int64), "shape")

    def model(self, name, inputs, outputs, opset: int = OPSET) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="amp-rewrite-models"
        )
        model.ir_version = 8
        return model


def _tensor(name: str, shape, elem_type=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def seed_cnn(image_size: int = 256, batch: int | str = "batch", classes: int = 10, channels: int = 3,
             widths: tuple[int, int] = (64, 128)) -> onnx.ModelProto:
    """The seed experiment's CNN (BACKGROUND.md): two conv blocks, GAP, dense, softmax."""
    g = _Graph(seed=1)
    x = "image"
    for channels_in, channels_out, kernel in ((channels, widths[0], 7), (widths[0], widths[1], 11)):
        conv = g.op("Conv", x, g.weight(channels_out, channels_in, kernel, kernel), g.weight(channels_out, scale=0.1),
                    strides=[2, 2], auto_pad="SAME_UPPER")
        act = g.op("Relu", conv)
        ones = np.ones(channels_out, np.float32)
        x = g.op("BatchNormalization", act, g.initializer(ones * 1.1), g.initializer(ones * 0.05),
                 g.initializer(ones * 0.2), g.initializer(ones * 0.9), epsilon=1e-3)
    flat = g.op("Flatten", g.op("GlobalAveragePool", x), axis=1)
    logits = g.op("Gemm", flat, g.weight(widths[1], classes), g.weight(classes, scale=0.1))
    g.op("Softmax", logits, outputs=["probabilities"], name="softmax", axis=-1)
    return g.model(
        "seed_cnn",
        [_tensor("image", [batch, channels, image_size, image_size])],
        [_tensor("probabilities", [batch, classes])],
    )


def mlp(features: int = 64, hidden: int = 128, classes: int = 10, layers: int = 3) -> onnx.ModelProto:
    """Gemm/MatMul layers with ReLU and a LogSoftmax head."""
    g = _Graph(seed=2)
    x, width = "x", features
    for i in range(layers):
        if i % 2 == 0:
            x = g.op("Gemm", x, g.weight(width, hidden), g.weight(hidden, scale=0.1))
        else:
            x = g.op("Add", g.op("MatMul", x, g.weight(width, hidden)), g.weight(hidden, scale=0.1))
        x, width = g.op("Relu", x), hidden
    logits = g.op("MatMul", x, g.weight(width, classes))
    g.op("LogSoftmax", logits, outputs=["log_probs"], name="log_softmax", axis=-1)
    return g.model("mlp", [_tensor("x", ["batch", features])], [_tensor("log_probs", ["batch", classes])])


def _layer_norm(g: _Graph, x: str, width: int, fused: bool) -> str:
    scale, bias = g.initializer(np.ones(width, np.float32)), g.initializer(np.zeros(width, np.float32))
    if fused:
        return g.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=1e-5)
    mean = g.op("ReduceMean", x, axes=[-1])
    centered = g.op("Sub", x, mean)
    variance = g.op("ReduceMean", g.op("Pow", centered, g.scalar(2.0)), axes=[-1])
    std = g.op("Sqrt", g.op("Add", variance, g.scalar(1e-5)))
    return g.op("Add", g.op("Mul", g.op("Div", centered, std), scale), bias)


def _gelu_erf(g: _Graph, x: str) -> str:
    erf = g.op("Erf", g.op("Div", x, g.scalar(math.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.scalar(1.0))), g.scalar(0.5))


def _encoder_block(g: _Graph, x: str, width: int, heads: int, mask: str | None, fused_ln: bool) -> str:
    head_dim = width // heads
    split_heads = g.dims(0, -1, heads, head_dim)

    def project_heads(source: str) -> str:
        projected = g.op("Add", g.op("MatMul", source, g.weight(width, width)), g.weight(width, scale=0.02))
        return g.op("Transpose", g.op("Reshape", projected, split_heads), perm=[0, 2, 1, 3])

    q, k, v = project_heads(x), project_heads(x), project_heads(x)
    kt = g.op("Transpose", k, perm=[0, 1, 3, 2])
    scores = g.op("Div", g.op("MatMul", q, kt), g.scalar(math.sqrt(head_dim)))
    if mask is not None:
        scores = g.op("Add", scores, mask)
    attn = g.op("Softmax", scores, axis=-1)
    context = g.op("Transpose", g.op("MatMul", attn, v), perm=[0, 2, 1, 3])
    merged = g.op("Reshape", context, g.dims(0, -1, width))
    out = g.op("Add", g.op("MatMul", merged, g.weight(width, width)), g.weight(width, scale=0.02))
    x = _layer_norm(g, g.op("Add", x, out), width, fused_ln)
    hidden = g.op("Add", g.op("MatMul", x, g.weight(width, 4 * width)), g.weight(4 * width, scale=0.02))
    ffn = g.op("Add", g.op("MatMul", _gelu_erf(g, hidden), g.weight(4 * width, width)), g.weight(width, scale=0.02))
    return _layer_norm(g, g.op("Add", x, ffn), width, fused_ln)


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
    g.op("Identity", x, outputs=["hidden_out"], name="output")
    outputs.append(_tensor("hidden_out", ["batch", seq, width]))
    inputs = [_tensor("hidden_in", ["batch", seq, width])]
    if with_mask:
        inputs.append(_tensor("mask", ["batch", 1, seq, seq]))
    return g.model("transformer", inputs, outputs)


def control_flow(width: int = 16) -> onnx.ModelProto:
    """If and Loop subgraphs whose bodies compute on a tensor captured from the outer graph."""
    g = _Graph(seed=4)
    projected = g.op("MatMul", "x", g.weight(width, width), outputs=["projected"])
    weight = g.weight(width, width)

    then = g.child()
    then_out = then.op("Relu", then.op("MatMul", projected, weight, name="then_matmul"), name="then_relu")
    otherwise = g.child()
    else_out = otherwise.op("Softmax", projected, name="else_softmax", axis=-1)
    branched = g.op("If", "use_matmul",
                    then_branch=helper.make_graph(then.nodes, "then_branch", [], [_tensor(then_out, None)]),
                    else_branch=helper.make_graph(otherwise.nodes, "else_branch", [], [_tensor(else_out, None)]))

    body = g.child()
    tanh = body.op("Tanh", body.op("MatMul", "carried", weight, name="body_matmul"), name="body_tanh")
    carried_out = body.op("Add", tanh, projected, name="body_add")
    cond_out = body.op("Identity", "cond_in", name="body_cond")
    loop_body = helper.make_graph(
        body.nodes, "loop_body",
        [_tensor("iteration", [], TensorProto.INT64), _tensor("cond_in", [], TensorProto.BOOL),
         _tensor("carried", ["batch", width])],
        [_tensor(cond_out, [], TensorProto.BOOL), _tensor(carried_out, ["batch", width])],
    )
    looped = g.op("Loop", g.initializer(np.array(3, np.int64), "trips"), None, branched, body=loop_body)
    g.op("Add", looped, projected, outputs=["y"], name="final_add")
    return g.model(
        "control_flow",
        [_tensor("x", ["batch", width]), _tensor("use_matmul", [], TensorProto.BOOL)],
        [_tensor("y", ["batch", width])],
    )


def dynamic_batch(features: int = 32) -> onnx.ModelProto:
    """An MLP whose batch dimension is symbolic, reshaped through a Shape-computed target."""
    g = _Graph(seed=5)
    h = g.op("Relu", g.op("Gemm", "x", g.weight(features, features), g.weight(features, scale=0.1)))
    batch_dim = g.op("Gather", g.op("Shape", h), g.initializer(np.array([0], np.int64), "idx"), axis=0)
    target = g.op("Concat", batch_dim, g.dims(4, features // 4), axis=0)
    grouped = g.op("Reshape", h, target)
    g.op("ReduceMax", grouped, outputs=["y"], name="reduce_max", axes=[2], keepdims=0)
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


def _from_text(text: str, weights: dict[str, np.ndarray], name: str = "fragile") -> onnx.ModelProto:
    model = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {OPSET}]>\n{name} {text}')
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


RMS_SCALINGS = {  # an RMSNorm's scaling of x{i} by its RMS s{i}, as exporters write it
    "mul-div-one": "r{i} = Div(one{i}, s{i})\n [scale{i}] n{i} = Mul(x{i}, r{i})",
    "reciprocal-mul": "r{i} = Reciprocal(s{i})\n [scale{i}] n{i} = Mul(r{i}, x{i})",
    "div": "[scale{i}] n{i} = Div(x{i}, s{i})",
}


def rms_decoder(scaling: str) -> onnx.ModelProto:
    """Two pre-norm residual blocks, ``x{i+1} = x{i} + MatMul(w * rms_norm(x{i}), m{i})``, fed by a
    MatMul: the RMSNorm written out, its scaling one of ``RMS_SCALINGS``. The scalar ``k``, read
    by no node, is there for tests that rewire the graph."""
    text = "(float[2,8,16] inp) => (float[2,8,16] y) {\n [embed] x0 = MatMul(inp, m9)"
    for i in range(2):
        text += f"""
          two{i} = Constant<value = float {{2.0}}>()
          eps{i} = Constant<value = float {{1e-6}}>()
          one{i} = Constant<value = float {{1.0}}>()
          [square{i}] p{i} = Pow(x{i}, two{i})
          [mean{i}] v{i} = ReduceMean<axes=[-1]>(p{i})
          [eps_add{i}] a{i} = Add(v{i}, eps{i})
          [sqrt{i}] s{i} = Sqrt(a{i})
          {RMS_SCALINGS[scaling].format(i=i)}
          [weight{i}] o{i} = Mul(w, n{i})
          [proj{i}] h{i} = MatMul(o{i}, m{i})
          [residual{i}] x{i + 1} = Add(x{i}, h{i})"""
    text += "\n [out] y = Identity(x2)\n}"
    weights = {f"m{i}": np.random.default_rng(i).normal(0, 0.3, (16, 16)).astype(np.float32) for i in (0, 1, 9)}
    return _from_text(text, {**weights, "w": np.random.default_rng(3).normal(1, 0.1, 16).astype(np.float32),
                             "k": np.array(0.5, np.float32)}, "rms_decoder")


def feature_pyramid(levels: int = 4, width: int = 8) -> onnx.ModelProto:
    """YOLO's neck in small: ``levels`` Convs of stride 2 over an image of named extents, the
    last map upsampled x2 and concatenated with the one before: it runs where that map has twice
    the last one's extent (at 2 ** levels, 16 by default; not at 8, where both are 1)."""
    rng = np.random.default_rng(11)
    convs = "\n".join(f"[c{i}] x{i} = Conv<strides=[2,2], pads=[1,1,1,1]>(x{i - 1}, w{i})"
                      for i in range(1, levels + 1))
    weights = {f"w{i}": rng.normal(0, 0.2, (width, 3 if i == 1 else width, 3, 3)).astype(np.float32)
               for i in range(1, levels + 1)}
    return _from_text(f"""(float[batch,3,height,width] x0) => (float[batch,{2 * width},h,w] y) {{ {convs}
      [up] u = Resize<mode="nearest">(x{levels}, roi, scales)
      [cat] y = Concat<axis=1>(x{levels - 1}, u)
    }}""", {**weights, "roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)})


FRAGILE = {"fragile_layer_norm": fragile_layer_norm, "fragile_log_softmax": fragile_log_softmax,
           "cancellation": cancellation}
"""Models that break in float16 when every node runs low, each with a sample that shows it."""
