"""Why a loss reaches no trainable weight: the op that stops the gradient, named.

A model whose loss depends on no weight through a differentiable path is refused; the refusal
names where the path ends, so the user learns what kind of model this is rather than that
"nothing" was found: the node that turns a value computed from float weights into an integer
or boolean one (k-NN's TopK indices, a comparison, an ArgMax), else an ai.onnx.ml node that
keeps its parameters in attributes in a form training does not lower (an SVM, a tree ensemble
with a MIN or MAX aggregate), else no weight at all.

Invariant: ``why_no_weights`` only reads the model; its answer is one line.
"""

from __future__ import annotations

import onnx

from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.types import typed_index
from amp_rewrite.training.adapters.attribute_weights import ML_DOMAIN


def why_no_weights(proto: onnx.ModelProto, loss: str) -> str:
    """One line: why the top-level graph's ``loss`` reaches no float weight through a gradient."""
    index = typed_index(proto)
    graph = proto.graph
    weighted = {t.name for t in graph.initializer if t.data_type in FLOAT_TYPES}
    for node in graph.node:  # topological: the values computed from a float weight
        if weighted.intersection(node.input):
            weighted.update(name for name in node.output if name)
    producers = {name: node for node in graph.node for name in node.output if name}
    path, seen, todo, visited = [], {loss}, [loss], set()
    while todo:  # the nodes the loss is computed by, nearest first
        node = producers.get(todo.pop(0))
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        path.append(node)
        fresh = [name for name in node.input if name and name not in seen]
        seen.update(fresh)
        todo.extend(fresh)
    prefix = f"the loss {loss!r} depends on no trainable weight: nothing to train"

    def elem_type(name: str) -> int | None:
        value = index.values.get((0, name))
        return value.elem_type if value is not None else None

    for node in path:
        used = [name for name in node.output if name in seen and name in weighted]
        if used and all(elem_type(name) not in FLOAT_TYPES for name in used) and any(
                name in weighted and elem_type(name) in FLOAT_TYPES for name in node.input):
            kind = onnx.helper.tensor_dtype_to_np_dtype(elem_type(used[0]) or onnx.TensorProto.INT64).name
            return (f"{prefix} (its float weights reach it only through {node.op_type} {node.name or used[0]!r}, "
                    f"whose output {used[0]!r} is {kind}: no gradient passes an integer or boolean value)")
    held = next((node for node in path if node.domain == ML_DOMAIN and node.op_type not in UNWEIGHTED), None)
    if held is not None:
        return (f"{prefix} ({held.op_type} {held.name or held.output[0]!r} keeps its parameters in attributes in a "
                f"form training does not lower: it trains ai.onnx.ml's linear models and tree ensembles that sum or "
                f"average their trees)")
    return f"{prefix} (no float weight lies on a differentiable path to it)"


UNWEIGHTED = frozenset({"ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
                        "FeatureVectorizer", "Imputer", "LabelEncoder", "OneHotEncoder", "ZipMap"})
"""ai.onnx.ml ops that hold no trained parameters: data handling, never the reason."""
