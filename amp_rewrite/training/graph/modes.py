"""Train mode for the step's forward: BatchNormalization on batch statistics, Dropout active.

A BatchNormalization node becomes standard ops (as PyTorch's train mode computes it):
the batch mean and biased variance over every axis but the channel normalise the
input, and the running statistics move towards the batch's (the variance's unbiased
estimate, as PyTorch keeps it) with the node's momentum. ``batch_statistics`` holds the
two formulations of the normalisation and the choice between them (``FORMULATION``, data):
``decomposed`` (reductions and elementwise ops, which the mixed-precision policy keeps
float32 over the whole activation) and ``layer-norm`` (the default where the opset has
LayerNormalization and the input spatial axes: per-(n, c) statistics from
LayerNormalization, combined per channel, applied by an inference-mode
BatchNormalization; where the rewrite makes the activation float16, float32 holds only the
[N, C] and [C] statistics, never a tensor shaped like the activation, forward or backward;
a BatchNormalization that only a GlobalAveragePool reads is never made: the pool is written
from the per-(n, c) means). Either way the gradient comes from the ops' own rules. The running statistics become
carried state: graph inputs and outputs of the step. Dropout nodes get ``training_mode``
true.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.ir.sizes import ValueSizes, iter_graphs
from amp_rewrite.ir.tensors import initializer_to_input, read_array
from amp_rewrite.ir.types import typed_index
from amp_rewrite.training.graph import batch_statistics

RUNNING_ROLES = ("running_mean", "running_var")
"""The roles (``Carried.role``) of the running statistics."""


@dataclass
class RunningStat:
    input: str
    output: str
    role: str
    value: np.ndarray


def untrained(stats: list[tuple[str, np.ndarray]]) -> bool:
    """Whether the running statistics of ``stats`` ((role, value) pairs) were never measured on
    data: every one holds its initial value (means 0, variances 1: a model exported before it saw
    data), or every one holds a single value across its channels while some has several (the
    placeholders of a test model; statistics measured on data differ between channels). Training
    on batch statistics then replaces them with the data's, and the inference outputs move far
    from the given model's even where the training loss falls."""
    if not stats:
        return False
    initial = all(np.all(value == (0.0 if role == "running_mean" else 1.0)) for role, value in stats)
    uniform = all(np.all(value == value.flat[0]) for _, value in stats if value.size)
    return initial or uniform and any(value.size > 1 for _, value in stats)


def batchnorm_to_train_mode(proto: onnx.ModelProto) -> list[RunningStat]:
    """Rewrite every top-level BatchNormalization (in place); return the running statistics,
    now graph inputs, with the values that update them."""
    index = typed_index(proto)
    sizes = ValueSizes(index)
    b = GraphBuilder.for_index(index, prefix="bn_")
    tensors = {t.name: t for t in proto.graph.initializer}
    stats: list[RunningStat] = []
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    """Outputs of Identity nodes whose statistics became initializers of their own."""
    for node in index.nodes:
        proto_node = node.proto
        if node.graph != 0 or node.op_type != "BatchNormalization" or node.domain != "":
            continue
        x, scale, bias, mean, var = proto_node.input[:5]
        for stat in (mean, var):  # TorchScript shares equal fresh statistics: each BN reads an Identity of one
            if stat not in tensors and (source := _identity_of_initializer(proto.graph, stat, tensors)) is not None:
                copy = onnx.TensorProto()
                copy.CopyFrom(source)
                copy.name = stat
                proto.graph.initializer.append(copy)
                tensors[stat] = copy
                dropped.add(stat)
        if mean not in tensors or var not in tensors:
            via = {n.proto.op_type for n in (index.producer_node(index.value(node.inputs[i])) for i in (3, 4))
                   if n is not None}
            raise UserError(f"BatchNormalization {node.label!r}: its running statistics are not initializers "
                            f"(computed by {', '.join(sorted(via)) or 'graph inputs'}), so they cannot be updated; "
                            f"train with them frozen: --batchnorm freeze (batchnorm='freeze')")
        shape = sizes.shape(index.value(node.inputs[0]))
        if shape is None:
            raise UserError(f"BatchNormalization {node.label!r}: the rank of its input is unknown")
        attrs = {a.name: helper.get_attribute_value(a) for a in proto_node.attribute}
        eps, momentum = attrs.get("epsilon", 1e-5), attrs.get("momentum", 0.9)
        step = b.child()
        pool = _only_reader_a_pool(index, node)
        if pool is not None and batch_statistics.formulation(b.opset, len(shape)) == "layer-norm":
            batch_mean, batch_var = batch_statistics.pooled(step, x, scale, bias, pool.proto.output[0], eps, len(shape))
            replaced[pool.position] = []  # the pool's output is made with the statistics
        else:
            batch_mean, batch_var = batch_statistics.normalised(step, x, scale, bias, proto_node.output[0], eps,
                                                                len(shape))
        count = step.op("Cast", step.op("Div", step.op("Size", x), step.op("Size", batch_mean)),
                        to=b.types[batch_var])
        unbiased = step.op("Mul", batch_var, step.op("Div", count, step.op("Sub", count, step.const(1.0, like=count))))
        for stat, batch_value, role in ((mean, batch_mean, "running_mean"), (var, unbiased, "running_var")):
            flat = step.op("Reshape", batch_value, step.ints([-1]))
            moved = step.op("Add", step.op("Mul", stat, step.const(momentum, like=stat)),
                            step.op("Mul", flat, step.const(1 - momentum, like=stat)))
            stats.append(RunningStat(stat, moved, role, read_array(tensors[stat], None).astype(np.float32)))
        replaced[node.position] = step.nodes
        proto.graph.value_info.extend(batch_statistics.declarations(step.nodes))
    if replaced or dropped:
        nodes = [new for at, old in enumerate(proto.graph.node) for new in replaced.get(at, [old])
                 if not (new.op_type == "Identity" and new.output[0] in dropped)]
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
    for stat in stats:
        initializer_to_input(proto.graph, tensors[stat.input], TensorProto.FLOAT)
    return stats


def _only_reader_a_pool(index, node):
    """The top-level GlobalAveragePool that is the only reader of ``node``'s output (not a graph
    output), or None."""
    out = index.values.get(node.outputs[0]) if node.outputs and node.outputs[0] is not None else None
    if out is None or out.output_of or len(out.uses) != 1:
        return None
    reader = index.nodes[out.uses[0][0]]
    return reader if reader.graph == 0 and reader.op_type == "GlobalAveragePool" and reader.domain == "" else None


BATCHNORM_MODES = ("auto", "train", "freeze")
"""``build``'s ``batchnorm``: "auto" is resolved by ``batchnorm_mode``."""


def batchnorm_mode(proto: onnx.ModelProto, batchnorm: str) -> str:
    """``batchnorm``, with "auto" resolved: "freeze" where some top-level BatchNormalization's
    running statistics were trained (a pretrained model: fine-tuning keeps them, as Keras advises,
    so a few small batches do not replace what the model learned on its data), "train" where
    none was measured on data (``untrained``: a model never trained learns them) or where they are
    computed, not stored."""
    if batchnorm != "auto":
        return batchnorm
    tensors = {t.name: t for t in proto.graph.initializer}
    stats = []
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for i, role in ((3, "running_mean"), (4, "running_var")):
                stored = _stored(proto.graph, node.input[i], tensors)
                if stored is not None:
                    stats.append((role, read_array(stored, None)))
    return "train" if not stats or untrained(stats) else "freeze"


def frozen_statistics(proto: onnx.ModelProto) -> set[str]:
    """The tensors read only as an inference-mode BatchNormalization's running mean or variance
    (directly, or through Identity nodes that only such reads read), in any graph. They are the
    model's buffers, not its parameters (PyTorch's ``running_mean``/``running_var``): a frozen
    normalisation uses them as they are, and descending on them would move a variance by the
    learning rate each step, past zero where it is small."""
    statistics: set[str] = set()
    other: set[str] = set()
    copies: dict[str, str] = {}
    """Identity output -> its input."""
    for graph in iter_graphs(proto.graph):
        for node in graph.node:
            if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
                copies[node.output[0]] = node.input[0]
                continue
            is_norm = node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
            for at, name in enumerate(node.input):
                (statistics if is_norm and at in (3, 4) else other).add(name)
        other.update(o.name for o in graph.output)
    for copy, source in copies.items():  # a copy read otherwise makes its source read otherwise
        (statistics if copy in statistics and copy not in other else other).add(source)
    return statistics - other


def _stored(graph: onnx.GraphProto, name: str, tensors: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The initializer ``name``, or the one a top-level Identity making it copies (TorchScript's
    shared statistics), if either holds it."""
    return tensors[name] if name in tensors else _identity_of_initializer(graph, name, tensors)


def _identity_of_initializer(graph: onnx.GraphProto, name: str,
                             tensors: dict[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The initializer that a top-level Identity making ``name`` copies, if one does."""
    node = next((n for n in graph.node if n.output and n.output[0] == name), None)
    if node is None or node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
        return None
    return tensors.get(node.input[0])


def dropout_to_train_mode(proto: onnx.ModelProto) -> None:
    """Give every Dropout ``training_mode`` true (its ratio defaults to 0.5)."""
    names = Names.of_model(proto)
    for node in proto.graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.input) < 2 or not node.input[1]:
            ratio = next((a.f for a in node.attribute if a.name == "ratio"), 0.5)
            ratio_name = names.fresh(f"{node.name or 'dropout'}_ratio")
            proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(ratio, np.float32), ratio_name))
            del node.input[1:]
            node.input.append(ratio_name)
        flag = names.fresh(f"{node.name or 'dropout'}_training")
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(True), flag))
        del node.input[2:]
        node.input.append(flag)
        kept = [a for a in node.attribute if a.name not in ("ratio", "is_test")]
        del node.attribute[:]
        node.attribute.extend(kept)
