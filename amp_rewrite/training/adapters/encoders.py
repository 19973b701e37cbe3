"""String inputs: the model's encoders of them run ahead of the training step.

scikit-learn pipelines read string columns (a colour, a city) through ai.onnx.ml encoders
(OneHotEncoder, LabelEncoder) into the numbers the rest of the model computes with. ONNX
Runtime binds no string tensor to a session's inputs (the step runs with I/O binding), and
no weight sits in an encoder, so ``split`` takes the encoders out of the model into a model of
their own (the *encoder*: the string inputs in, the numbers it hands to the rest out), and the
step reads those numbers as data inputs. ``Encoding`` runs the encoder on the user's data
(plain ``InferenceSession.run``, which takes strings): whatever feeds data to the step goes
through it, and the user's data keeps its strings.

The encoder is the largest set of nodes fed by the string inputs and constants alone: a
node that reads a numeric graph input or a float initializer (a weight the step may train),
or a value made from one, stays in the step. Invariant after ``split``: the model reads no
string input, computes from the encoder's outputs (declared as its inputs, with the types
onnx's shape inference gives them) what it computed before, and has lost only the encoder's
nodes, the constants only they read, and its outputs computed from the strings alone (they hold
nothing to train). A string that reaches a node reading numbers or weights is refused, in one line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.inputs import samples
from amp_rewrite.ir.graph import names_read
from amp_rewrite.runtime import instrument


def split(model: onnx.ModelProto, weights: Collection[str]) -> onnx.ModelProto | None:
    """Take the encoders of ``model``'s string inputs out of it (in place; see the module's
    docstring) and return them as a model of their own, or None where nothing the step computes
    reads a string. ``weights``: the float initializers (what the step may train)."""
    graph = model.graph
    inputs = samples.graph_inputs(model)
    strings = [name for name, info in inputs.items() if info.type.tensor_type.elem_type == TensorProto.STRING]
    if not strings:
        return None
    origin = {name: name for name in strings}  # each value made of strings alone -> a string input it is made of
    numeric = {name for name in inputs if name not in origin} | set(weights)
    encoding: set[int] = set()
    for index, node in enumerate(graph.node):  # in order: a node comes after the values it reads
        read = names_read([node])
        made = [o for o in node.output if o]
        if read & numeric:
            numeric.update(made)
        elif sources := [origin[n] for n in (*node.input, *sorted(read)) if n in origin]:
            origin.update((o, sources[0]) for o in made)
            encoding.add(index)
    kept = [node for index, node in enumerate(graph.node) if index not in encoding]
    read_by_step = names_read(kept)
    for name in strings:
        if name in read_by_step:
            _refuse(name, name, kept)
    boundary = [o for index in sorted(encoding) for o in graph.node[index].output if o in read_by_step]
    chosen = _with_constants(graph, encoding)
    read = names_read(graph.node[i] for i in chosen)
    encoder = helper.make_model(
        helper.make_graph([graph.node[i] for i in sorted(chosen)], f"{graph.name}.encoder",
                          [i for i in graph.input if i.name in read and i.name in origin],
                          [onnx.ValueInfoProto(name=name) for name in boundary],
                          [t for t in graph.initializer if t.name in read],
                          value_info=[v for v in graph.value_info if v.name in origin]),
        opset_imports=model.opset_import, ir_version=model.ir_version, functions=model.functions)
    declared = _declared(encoder, boundary)
    for name in boundary:
        if declared[name].type.tensor_type.elem_type == TensorProto.STRING:
            _refuse(name, origin[name], kept)
    _remove(graph, encoding, chosen - encoding, set(origin), [declared[name] for name in boundary])
    return encoder if boundary else None


def _refuse(value: str, source: str, nodes: Sequence[onnx.NodeProto]) -> None:
    reader = next(n for n in nodes if value in names_read([n]))
    raise UserError(f"input {source!r} holds strings, and {reader.op_type} node {reader.name or reader.output[0]!r} "
                    f"reads them with numbers or weights: the training step takes numbers only (only the encoders "
                    f"of strings, nodes fed by strings and constants alone, run ahead of it)")


def _with_constants(graph: onnx.GraphProto, encoding: set[int]) -> set[int]:
    """The nodes ``encoding`` (indices) and the constant nodes they read, directly or not."""
    producer = {o: index for index, node in enumerate(graph.node) for o in node.output}
    chosen, pending = set(encoding), sorted(names_read(graph.node[i] for i in encoding))
    while pending:
        index = producer.get(pending.pop(), -1)
        if index >= 0 and index not in chosen:
            chosen.add(index)
            pending.extend(names_read([graph.node[index]]))
    return chosen


def _declared(encoder: onnx.ModelProto, outputs: list[str]) -> dict[str, onnx.ValueInfoProto]:
    """Each of the encoder's ``outputs`` as onnx's shape inference types it (written into the
    encoder's outputs); a UserError where it finds no element type."""
    try:
        inferred = onnx.shape_inference.infer_shapes(encoder, data_prop=True)
    except Exception:  # an op whose inference fails: the outputs stay untyped, refused below
        inferred = encoder
    found = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output) if v.type.HasField("tensor_type")}
    untyped = [name for name in outputs if name not in found or not found[name].type.tensor_type.elem_type]
    if untyped:
        raise UserError(f"the type of {untyped[0]!r}, which the model computes from its string inputs alone, is "
                        f"unknown to onnx's shape inference: the training step cannot declare it as an input")
    del encoder.graph.output[:]
    encoder.graph.output.extend(found[name] for name in outputs)
    return {name: found[name] for name in outputs}


def _remove(graph: onnx.GraphProto, encoding: set[int], constants: set[int], made: set[str],
            encoded: list[onnx.ValueInfoProto]) -> None:
    """The encoder out of ``graph``: its nodes ``encoding``, those of the ``constants`` (nodes) and
    the initializers that only they read, the string inputs and the outputs ``made`` from strings
    alone; ``encoded`` in as inputs."""
    outputs = [o for o in graph.output if o.name not in made]
    read = names_read(n for i, n in enumerate(graph.node) if i not in encoding | constants) | {o.name for o in outputs}
    live = set()
    for index in sorted(constants, reverse=True):  # a constant's readers come after it
        if read & set(graph.node[index].output):
            live.add(index)
            read |= names_read([graph.node[index]])
    dead = encoding | (constants - live)
    gone = made | {o for i in dead for o in graph.node[i].output}
    only_encoders = names_read(graph.node[i] for i in dead) - read
    replaced = {
        "node": [n for i, n in enumerate(graph.node) if i not in dead],
        "output": outputs,
        "initializer": [t for t in graph.initializer if t.name not in only_encoders],
        "input": [i for i in graph.input if i.name not in made | only_encoders] + encoded,
        "value_info": [v for v in graph.value_info if v.name not in gone]}
    for field, values in replaced.items():
        del getattr(graph, field)[:]
        getattr(graph, field).extend(values)


class Encoding:
    """The encoder (``split``'s model; None: a model without strings) run on data: a mapping of
    arrays with the string inputs' arrays (str or object elements) replaced by the arrays the
    encoder makes of them. Data without the string arrays (encoded already) comes back as it is."""

    def __init__(self, encoder: onnx.ModelProto | None) -> None:
        self.encoder = encoder
        self.strings = [i.name for i in encoder.graph.input] if encoder is not None else []
        """The string inputs the encoder reads."""
        self.encoded = [o.name for o in encoder.graph.output] if encoder is not None else []
        """What it makes of them: data inputs of the step."""
        self._session = None

    def __call__(self, data: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self.encoder is None or not any(name in data for name in self.strings):
            return data
        missing = [name for name in self.strings if name not in data]
        if missing:
            raise UserError(f"the data lacks the string input {missing[0]!r} (the model encodes its strings together)")
        feeds = {name: np.asarray(data[name]).astype(object) for name in self.strings}  # str, as ONNX Runtime takes
        with instrument.refusals("the encoder of the string inputs", "CPUExecutionProvider"):
            self._session = self._session or instrument.session(self.encoder)
            encoded = instrument.run(self._session, feeds)
        return {**{k: v for k, v in data.items() if k not in feeds}, **encoded}

    def extents(self, specialize: Mapping[str, Sequence[int]],
                sample: Mapping[str, np.ndarray] | None) -> dict[str, Sequence[int]]:
        """``specialize`` (input name -> extents) with the string inputs' extents replaced by those of
        what the encoder makes of ``sample``, whose string arrays must have them."""
        named = [name for name in self.strings if name in specialize]
        if not named:
            return dict(specialize)
        if sample is None or any(list(np.shape(sample.get(n, ()))) != list(specialize[n]) for n in named):
            raise UserError(f"the step is specialized to extents of the string input {named[0]!r}: give training "
                            f"data (range_data) of those extents, which the encoder turns into the step's")
        encoded = self(sample)
        return {**{k: v for k, v in specialize.items() if k not in self.strings},
                **{name: np.shape(encoded[name]) for name in self.encoded}}
