"""The step's backward, update and carried values, after its forward: ``assemble``.

Invariant: after ``assemble``, the graph reads the hyper-parameters (``LR``, ``WEIGHT_DECAY``),
the loss-scale state, the step count and every optimizer state and gradient sum as float32
inputs, and writes each one's next value as an output (``Carried``), with the skipped flag last;
a step whose gradients hold an inf or NaN (or a window still summing) keeps every old value.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.autodiff import add_backward
from amp_rewrite.errors import UserError
from amp_rewrite.training.graph.accumulation import COUNT, COUNT_ROLE, SUM_ROLE, accumulated
from amp_rewrite.training.graph.flat_state import groups
from amp_rewrite.training.graph.modes import RunningStat
from amp_rewrite.training.graph.optimizers import SGD, AdamW, Hyper, clipped_by_global_norm
from amp_rewrite.training.graph.scaling import LossScale, non_finite, unscale, update
from amp_rewrite.training.spec import Carried

LR, WEIGHT_DECAY = "lr", "weight_decay"
"""The step's hyper-parameter inputs (float32 scalars): a schedule feeds them, no rebuild."""
FLOAT = TensorProto.FLOAT


@dataclass
class Assembled:
    carried: list[Carried]
    initial: dict[str, np.ndarray]
    skipped: str


def assemble(proto: onnx.ModelProto, loss: str, params: list[str], initial: dict[str, np.ndarray],
              opt: SGD | AdamW, scaling: LossScale, running: list[RunningStat], clip_norm: float | None,
              accumulate: int, conv_weight_grad: str, flat_state: str) -> Assembled:
    """The step's backward, update and carried values, in ``proto``. The update works on ``groups``
    of parameters (``flat_state``): a gradient, states and a sum per group, split back per parameter."""
    graph = proto.graph
    layout = groups(flat_state, {param: initial[param].shape for param in params})
    scalar_inputs = [LR, WEIGHT_DECAY, "loss_scale", "clean_steps", "step"] + ([COUNT] if accumulate > 1 else [])
    taken = {i.name for i in graph.input} | {n for x in graph.node for n in x.output}
    sums = [group.buffer(SUM_ROLE) for group in layout] if accumulate > 1 else []
    states = [[group.buffer(role) for role in opt.states] for group in layout]
    clash = [n for n in scalar_inputs + [s.name for s in (*sums, *itertools.chain(*states))] if n in taken]
    if clash:
        raise UserError(f"the model already has values named {', '.join(clash)}: rename them to train it")
    graph.input.extend(helper.make_tensor_value_info(n, FLOAT, []) for n in scalar_inputs)
    graph.input.extend(helper.make_tensor_value_info(s.name, FLOAT, s.shape) for s in sums)
    backprop = add_backward(proto, loss, params, seed="loss_scale", conv_weight_grad=conv_weight_grad)
    b = backprop.builder
    for name in scalar_inputs + [s.name for s in sums]:
        b.types[name] = FLOAT
    cast = {p: b.op("Cast", backprop.grads[p], to=FLOAT) if b.types[backprop.grads[p]] != FLOAT
            else backprop.grads[p] for p in params}
    grads = [group.joined(b, [cast[p] for p in group.shapes]) for group in layout]
    if scaling.checks:
        grads = unscale(b, grads, "loss_scale")
    window = accumulated(b, grads, [s.name for s in sums], accumulate) if accumulate > 1 else None
    grads = window.grads if window else grads
    found_inf = non_finite(b, grads) if scaling.checks else b.const(np.array(False))
    # whether the step keeps the weights, states and step count: a window still summed, or inf/NaN
    hold = b.op("Or", b.op("Not", window.apply), found_inf) if window else found_inf
    if clip_norm is not None:
        squares = [s for group, grad in zip(layout, grads) for s in group.square_sums(b, grad)]
        grads = clipped_by_global_norm(b, grads, squares, clip_norm)
    taking = b.op("Add", "step", b.const(1.0, like="step"))
    hyper = Hyper(LR, WEIGHT_DECAY, taking)
    carried, values, outputs = [], dict(initial), {}
    keeps = scaling.checks or window is not None
    for group, grad, buffers in zip(layout, grads, states):
        param = group.joined(b, list(group.shapes))
        new_param, new_states = opt.update(b, param, grad, [s.name for s in buffers], hyper)
        kept = b.op("Where", hold, param, new_param) if keeps else new_param
        for name, value in zip(group.shapes, group.split(b, kept)):
            outputs[name] = value
            carried.append(Carried(name, "", list(initial[name].shape)))
        for buffer, new, role in zip(buffers, new_states, opt.states):
            outputs[buffer.name] = b.op("Where", hold, buffer.name, new) if keeps else new
            carried.append(Carried(buffer.name, "", buffer.shape, role=role, of=buffer.of))
            values[buffer.name] = np.zeros(buffer.shape, np.float32)
            graph.input.append(helper.make_tensor_value_info(buffer.name, FLOAT, buffer.shape))
    for buffer, value in zip(sums, window.sums if window else []):
        outputs[buffer.name] = value
        carried.append(Carried(buffer.name, "", buffer.shape, role=SUM_ROLE, of=buffer.of))
        values[buffer.name] = np.zeros(buffer.shape, np.float32)
    for stat in running:  # a step with inf/NaN gradients keeps the old statistics too
        moved = stat.output if b.types.get(stat.output) == FLOAT else b.op("Cast", stat.output, to=FLOAT)
        outputs[stat.input] = b.op("Where", found_inf, stat.input, moved) if scaling.checks else moved
        carried.append(Carried(stat.input, "", list(stat.value.shape), role=stat.role))
    next_step = b.op("Where", hold, "step", taking) if keeps else taking
    scaling_state: tuple[str, ...]
    if scaling.mode == "dynamic":
        scaling_state = update(b, scaling, "loss_scale", "clean_steps", found_inf)
        if window:  # the scale changes once a window, when it is applied
            scaling_state = tuple(b.op("Where", window.apply, new, old)
                                  for new, old in zip(scaling_state, ("loss_scale", "clean_steps")))
    else:
        scaling_state = ("loss_scale", "clean_steps")
    scalars = [("loss_scale", scaling_state[0], "scale"), ("clean_steps", scaling_state[1], "clean_steps"),
               ("step", next_step, "step")] + ([(COUNT, window.count, COUNT_ROLE)] if window else [])
    for name, value, role in scalars:
        outputs[name] = value
        carried.append(Carried(name, "", [], role=role))
        values[name] = np.array(scaling.init if name == "loss_scale" else 0.0, np.float32)
    skipped = b.op("Identity", b.op("And", window.apply, found_inf) if window else found_inf,
                   outputs=[b.names.fresh("skipped")])
    graph.node.extend(b.nodes)
    for item in carried:
        item.output = b.names.fresh(f"{item.input}.next")
        graph.node.append(helper.make_node("Identity", [outputs[item.input]], [item.output],
                                           name=b.names.fresh(f"{item.output}_node")))
        graph.output.append(helper.make_tensor_value_info(item.output, FLOAT, item.shape))
    graph.output.append(helper.make_tensor_value_info(skipped, TensorProto.BOOL, []))
    return Assembled(carried, values, skipped)
