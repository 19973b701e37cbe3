"""``gradient_model``: a model that also outputs the gradient of its loss with respect to its weights."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amp_rewrite.autodiff.backward import Backward
from amp_rewrite.autodiff.context import NoParameters
from amp_rewrite.autodiff.conv_weight_grad import checked
from amp_rewrite.autodiff.lowerings.recurrent import unrolled
from amp_rewrite.autodiff.lowerings.unfused import has_fused_ops, unfused
from amp_rewrite.errors import UserError
from amp_rewrite.ir import declarations, io
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder
from amp_rewrite.ir.functions import inlined
from amp_rewrite.ir.graph import GRAPH_INPUT, INITIALIZER, ValueKey, names_read
from amp_rewrite.ir.opsets import ensure_opset
from amp_rewrite.ir.types import typed_index

MIN_OPSET = 16
"""Gradient graphs use ScatterND/ScatterElements with ``reduction="add"`` (opset 16); older
models are upgraded with ONNX's version converter first."""


@dataclass
class Backprop:
    """What :func:`add_backward` appended: each parameter's gradient value, by parameter name."""

    grads: dict[str, str]
    builder: GraphBuilder
    shapes: dict[str, tuple | None]
    """Each parameter's shape (ints, dimension names, or None per unknown extent)."""


def gradient_model(model, loss: str, wrt: Sequence[str] | None = None, *,
                   conv_weight_grad: str = "direct") -> onnx.ModelProto:
    """``model`` (a path, ``onnx.ModelProto`` or ``onnx_ir.Model``; never modified) with one more
    output per parameter: ``<name>_grad``, the gradient of the scalar float output ``loss``,
    with the parameter's shape and element type. ``wrt`` names the initializers (or float
    inputs) to differentiate; by default every float initializer the loss depends on.
    Every emitted op is a standard ONNX op. Raises :class:`UserError` on bad input or an op
    on the path without a gradient rule (before anything is built). ``conv_weight_grad``: see
    :func:`add_backward`."""
    proto, base_dir, _ = io.read_model(model, "differentiate")
    if base_dir is not None:
        io.embed_external(proto, base_dir)
    return gradient_proto(proto, loss, wrt, conv_weight_grad=conv_weight_grad)


def gradient_proto(proto: onnx.ModelProto, loss: str, wrt: Sequence[str] | None = None, *,
                   conv_weight_grad: str = "direct") -> onnx.ModelProto:
    """:func:`gradient_model` on a ModelProto that may be edited in place (external data may
    stay on disk)."""
    proto = differentiable(proto)
    unrolled(proto)  # RNN, GRU and LSTM of static length as the ops they are made of
    backprop = add_backward(proto, loss, wrt, conv_weight_grad=conv_weight_grad)
    graph = proto.graph
    taken = {o.name for o in graph.output} | backprop.builder.names.taken
    b = backprop.builder
    producers = {out: node for node in b.nodes for out in node.output}
    read = names_read(b.nodes) | {i for node in b.nodes for i in node.input}
    renamed: set[str] = set()
    for param, grad in backprop.grads.items():
        name = f"{param}_grad"
        if name in taken:
            raise UserError(f"cannot name the gradient of {param!r} {name!r}: the model has a value by that name")
        elem_type = b.types[grad]
        if grad in producers and grad not in read and grad not in renamed:
            # The gradient's own node takes the output name: no Identity.
            node = producers[grad]
            node.output[list(node.output).index(grad)] = name
            renamed.add(grad)
        else:
            b.op("Identity", grad, outputs=[name])
        shape = backprop.shapes[param]
        graph.output.append(helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape)))
    graph.node.extend(b.nodes)
    return proto


def differentiable(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` at opset MIN_OPSET or later (an upgraded copy where it is older), without the
    declared shapes that onnx's inference contradicts (a copy: rules read declared ranks), with
    the calls of its own functions inlined (a copy; rules are for ONNX's ops, and ONNX Runtime
    inlines the functions anyway), and ONNX Runtime's fused transformer ops written as the
    standard ops they fuse (a copy: ``unfused``)."""
    proto = declarations.truthful(ensure_opset(proto, MIN_OPSET))
    if proto.functions:
        try:
            proto = inlined(proto)
        except ValueError as exc:
            raise UserError(f"cannot inline the model's functions to differentiate it: {exc}") from None
    if has_fused_ops(proto):
        proto = onnx.ModelProto.FromString(proto.SerializeToString())
        unfused(proto)
    return proto


def add_backward(proto: onnx.ModelProto, loss: str, wrt: Sequence[str] | None = None,
                 seed: str | None = None, *, conv_weight_grad: str = "direct") -> Backprop:
    """Build the backward pass of ``loss`` with respect to ``wrt`` into the returned builder,
    whose nodes the caller appends to ``proto``'s graph (rules that differentiate through an
    If also export values from its branches, in place). ``seed`` names a value shaped like
    the loss that seeds its gradient (a loss scale); ones by default. ``conv_weight_grad``
    formulates Conv and ConvTranspose weight gradients: ``direct`` (one Conv over the
    batch-transposed operands), ``grouped``, ``transposed`` or ``im2col`` where they apply
    (``direct`` elsewhere), or ``auto`` (a rule by shape); see ``conv_weight_grad``."""
    checked(conv_weight_grad)
    index = typed_index(proto)
    outputs = {o.name for o in proto.graph.output}
    if loss not in outputs:
        raise UserError(f"loss {loss!r} is not an output of the model (outputs: {', '.join(sorted(outputs))})")
    loss_key = (0, loss)
    loss_value = index.values[loss_key]
    if loss_value.elem_type not in FLOAT_TYPES:
        raise UserError(f"loss {loss!r} is not a float tensor: it cannot be differentiated")
    engine = Backward(index, conv_weight_grad=conv_weight_grad)
    shape = engine.shapes.get(loss_key)
    if shape is not None and not all(d == 1 for d in shape):
        shown = ", ".join("?" if d is None else str(d) for d in shape)
        raise UserError(f"loss {loss!r} must be a scalar (one element); its shape is [{shown}]")
    targets = _targets(index, engine, loss_key, wrt)
    needed = engine.check(0, [loss_key], targets)
    unreached = [key[1] for key in targets if key not in needed]
    if unreached:
        raise UserError(f"the loss {loss!r} does not depend on {', '.join(map(repr, unreached))} through a "
                        "differentiable input (a running statistic, a bound or an exponent gets no gradient)")
    b = GraphBuilder.for_index(index, prefix="grad_", default_opset=MIN_OPSET)
    if seed is None:
        seed = b.op("ConstantOfShape", b.op("Shape", loss), value=numpy_helper.from_array(
            np.ones(1, helper.tensor_dtype_to_np_dtype(loss_value.elem_type))))
    else:  # a scale: the loss's shape and element type
        seed = b.op("Expand", seed, b.op("Shape", loss))
        if b.types.get(seed) != loss_value.elem_type:
            seed = b.op("Cast", seed, to=loss_value.elem_type)
    found = engine.run(0, {loss_key: seed}, targets, b)
    # A target on the path can still receive nothing (only a buffer output was read): zero.
    grads = {key[1]: found[key] if key in found else b.zeros_like(key[1]) for key in targets}
    return Backprop(grads, b, {key[1]: engine.shapes.get(key) for key in targets})


def default_parameters(proto: onnx.ModelProto, loss: str) -> list[str]:
    """Every float initializer that the output ``loss`` depends on through a differentiable input
    (at the opset gradients are built at: rules decide which inputs are differentiable)."""
    index = typed_index(differentiable(proto))
    return [key[1] for key in _targets(index, Backward(index), (0, loss), None)]


def _targets(index, engine: Backward, loss_key: ValueKey, wrt: Sequence[str] | None) -> list[ValueKey]:
    """The parameters: named ones (checked), or every float initializer the loss depends on."""
    if wrt is None:
        candidates = [k for k, v in index.values.items()
                      if k[0] == 0 and v.source == INITIALIZER and v.elem_type in FLOAT_TYPES]
        _, _, needed = engine.plan(0, [loss_key], candidates)
        found = [k for k in candidates if k in needed]
        if not found:
            raise NoParameters(f"the loss {loss_key[1]!r} depends on no float initializer: nothing to differentiate "
                               f"(weights held in Constant nodes or in op attributes are not differentiated)")
        return found
    targets = []
    for name in dict.fromkeys(wrt):
        value = index.values.get((0, name))
        if value is None or value.source not in (INITIALIZER, GRAPH_INPUT):
            raise UserError(f"--wrt {name!r} is not an initializer or input of the model")
        if value.elem_type not in FLOAT_TYPES:
            raise UserError(f"--wrt {name!r} is not a float tensor: it has no gradient")
        targets.append(value.key)
    return targets

