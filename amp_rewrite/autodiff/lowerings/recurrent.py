"""RNN, GRU and LSTM unrolled into the ops they are made of, so that the rules of those ops
differentiate them (OCR's CRNN, taggers and text classifiers use them, bidirectional, with
initial states and sequence lengths).

Each top-level recurrent node whose sequence length is static (a specialized step's is, see
``ir.specialize``) becomes, per direction, one MatMul of the whole input by the input weights,
then per time step the recurrent MatMul and the gates (ONNX's equations, default activations),
the hidden (and cell) state carried from step to step, and the outputs concatenated as the node
gave them: ``Y`` [T, D, N, H], ``Y_h`` and ``Y_c`` [D, N, H] (batch first where ``layout`` is
1). With ``sequence_lens`` a sample's state changes only at the steps within its length (a
reverse direction starts at its last one) and its outputs past it are zero. What the unrolling
does not cover is one error naming it: activations other than the defaults, ``clip``,
``input_forget`` and peepholes. ``unrolled`` unrolls Scan nodes too (``scan``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amp_rewrite.autodiff.context import DynamicShapes
from amp_rewrite.autodiff.lowerings.scan import unrolled_scan
from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder
from amp_rewrite.ir.types import typed_index

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
UNROLLED = (*GATES, "Scan")


def unrolled(model: onnx.ModelProto) -> list[str]:
    """Unroll the model's top-level RNN, GRU, LSTM and Scan nodes (in place; ``scan`` unrolls
    a Scan); their names."""
    graph = model.graph
    if not any(n.op_type in UNROLLED and n.domain in ("", "ai.onnx") for n in graph.node):
        return []
    index = typed_index(model)
    b = GraphBuilder.for_index(index, prefix="rnn_")
    nodes, done = [], []
    for node, indexed in zip(graph.node, (n for n in index.nodes if n.graph == 0)):
        if node.op_type not in UNROLLED or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        step = b.child()
        if node.op_type == "Scan":
            shapes = {key[1]: index.values[key].shape for key in (*indexed.inputs, *indexed.outputs)
                      if key is not None}
            unrolled_scan(node, step, shapes, b.opset)
        else:
            _Unrolling(node, step, indexed, index).build()
        nodes.extend(step.nodes)
        done.append(node.name or node.output[0])
    del graph.node[:]
    graph.node.extend(nodes)
    return done


class _Unrolling:
    def __init__(self, node: onnx.NodeProto, b: GraphBuilder, indexed, index) -> None:
        self.node, self.b, self.op = node, b, node.op_type
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        label = f"{node.op_type} node {node.name or node.output[0]!r}"
        activations = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
        direction = attrs.get("direction", b"forward")
        self.direction = direction.decode() if isinstance(direction, bytes) else direction
        directions = 2 if self.direction == "bidirectional" else 1
        if activations and activations != DEFAULT_ACTIVATIONS[self.op] * directions:
            raise UserError(f"cannot differentiate {label}: activations {activations} (only the defaults unroll)")
        for unsupported in ("clip", "input_forget"):
            if attrs.get(unsupported):
                raise UserError(f"cannot differentiate {label}: {unsupported} is not unrolled")
        inputs = list(node.input) + [""] * (8 - len(node.input))
        if self.op == "LSTM" and inputs[7]:
            raise UserError(f"cannot differentiate {label}: peepholes (P) are not unrolled")
        self.x, self.w, self.r, self.bias, self.lengths, self.h0 = inputs[:6]
        self.c0 = inputs[6] if self.op == "LSTM" else ""
        self.hidden, self.layout = attrs["hidden_size"], attrs.get("layout", 0)
        self.lbr = attrs.get("linear_before_reset", 0)
        shape = index.values[indexed.inputs[0]].shape
        steps = shape[1 if self.layout else 0] if shape and len(shape) == 3 else None
        if not isinstance(steps, int):
            raise DynamicShapes(f"cannot differentiate {label}: its sequence length is not static")
        self.steps, self.directions = steps, directions

    def build(self) -> None:
        b, outputs = self.b, list(self.node.output) + [""] * 3
        x = b.op("Transpose", self.x, perm=[1, 0, 2]) if self.layout else self.x
        finals = [self._direction(x, d) for d in range(self.directions)]
        sequence = b.op("Concat", *(b.axes_op("Unsqueeze", ys, [1]) for ys, _, _ in finals), axis=1)  # [T,D,N,H]
        states = [b.op("Concat", *(b.axes_op("Unsqueeze", state, [0]) for f in finals if (state := f[k]) is not None),
                       axis=0) for k in (1, 2) if finals[0][k] is not None]  # [D,N,H]
        for value, out, perm in ((sequence, outputs[0], [2, 0, 1, 3]), *(
                (s, outputs[k + 1], [1, 0, 2]) for k, s in enumerate(states))):
            if out:
                b.op("Transpose", value, perm=perm, outputs=[out]) if self.layout else b.op("Identity", value,
                                                                                          outputs=[out])

    def _direction(self, x: str, d: int) -> tuple[str, str, str | None]:
        """(the outputs [T, N, H] in time order, the last hidden state, the last cell state)."""
        b, gates = self.b, GATES[self.op]
        w = b.op("Transpose", b.op("Gather", self.w, b.const(np.int64(d)), axis=0), perm=[1, 0])  # [I, G*H]
        r = b.op("Transpose", b.op("Gather", self.r, b.const(np.int64(d)), axis=0), perm=[1, 0])  # [H, G*H]
        xw = b.op("MatMul", x, w)  # [T, N, G*H]
        recurrent_bias = None
        if self.bias:
            bias = b.op("Gather", self.bias, b.const(np.int64(d)), axis=0)
            xw = b.op("Add", xw, self._blocks(bias, 0, gates))
            recurrent_bias = self._blocks(bias, gates, 2 * gates)
        h = self._initial(self.h0, d, x)
        c = self._initial(self.c0, d, x) if self.op == "LSTM" else None
        order = range(self.steps) if self.direction == "forward" or (self.direction == "bidirectional" and d == 0) \
            else range(self.steps - 1, -1, -1)
        ys = {}
        for t in order:
            xt = b.op("Gather", xw, b.const(np.int64(t)), axis=0)  # [N, G*H]
            new_h, new_c = self._cell(xt, h, c, r, recurrent_bias)
            if self.lengths:
                running = b.axes_op("Unsqueeze", b.op("Less", b.const(t, elem_type=onnx.TensorProto.INT32), b.op(
                    "Cast", self.lengths, to=onnx.TensorProto.INT32)), [1])  # [N, 1]: t is within the sample
                ys[t] = b.op("Where", running, new_h, b.op("Mul", new_h, b.const(0.0, like=new_h)))
                new_h = b.op("Where", running, new_h, h)
                new_c = b.op("Where", running, new_c, c) if c is not None else None
            else:
                ys[t] = new_h
            h, c = new_h, new_c
        sequence = b.op("Concat", *(b.axes_op("Unsqueeze", ys[t], [0]) for t in range(self.steps)), axis=0)
        return sequence, h, c

    def _cell(self, xt: str, h: str, c: str | None, r: str, rb: str | None) -> tuple[str, str | None]:
        b, gates, blocks = self.b, GATES[self.op], self._blocks
        if self.op == "GRU":  # gates z, r, h
            z_r = b.op("MatMul", h, blocks(r, 0, 2, axis=1))
            z_r = b.op("Add", z_r, blocks(rb, 0, 2)) if rb else z_r
            z = b.op("Sigmoid", b.op("Add", blocks(xt, 0, 1, axis=1), blocks(z_r, 0, 1, axis=1)))
            reset = b.op("Sigmoid", b.op("Add", blocks(xt, 1, 2, axis=1), blocks(z_r, 1, 2, axis=1)))
            r_h = blocks(r, 2, 3, axis=1)
            if self.lbr:
                hr = b.op("MatMul", h, r_h)
                candidate = b.op("Mul", reset, b.op("Add", hr, blocks(rb, 2, 3)) if rb else hr)
            else:
                candidate = b.op("MatMul", b.op("Mul", reset, h), r_h)
                candidate = b.op("Add", candidate, blocks(rb, 2, 3)) if rb else candidate
            hh = b.op("Tanh", b.op("Add", blocks(xt, 2, 3, axis=1), candidate))
            return b.op("Add", hh, b.op("Mul", z, b.op("Sub", h, hh))), None
        pre = b.op("Add", xt, b.op("MatMul", h, r))
        pre = b.op("Add", pre, rb) if rb else pre
        if self.op == "RNN":
            return b.op("Tanh", pre), None
        i, o, f = (b.op("Sigmoid", blocks(pre, k, k + 1, axis=1)) for k in range(3))  # gates i, o, f, c
        cell = b.op("Add", b.op("Mul", f, c), b.op("Mul", i, b.op("Tanh", blocks(pre, 3, gates, axis=1))))
        return b.op("Mul", o, b.op("Tanh", cell)), cell

    def _blocks(self, value: str | None, first: int, last: int, axis: int = 0) -> str | None:
        """Gate blocks ``first`` to ``last`` (each ``hidden`` wide) of ``value`` along ``axis``."""
        if value is None:
            return None
        b, size = self.b, self.hidden
        return b.op("Slice", value, b.ints([first * size]), b.ints([last * size]), b.ints([axis]))

    def _initial(self, state: str, d: int, x: str) -> str:
        """Direction ``d``'s initial state [N, H]: the input's, or zeros."""
        b = self.b
        if state:  # [D, N, H], batch first [N, D, H]
            return b.op("Gather", state, b.const(np.int64(d)), axis=1 if self.layout else 0)
        batch = b.op("Slice", b.op("Shape", x), b.ints([1]), b.ints([2]), b.ints([0]))
        return b.op("ConstantOfShape", b.op("Concat", batch, b.ints([self.hidden]), axis=0),
                    value=numpy_helper.from_array(np.zeros(1, np.float32)))
