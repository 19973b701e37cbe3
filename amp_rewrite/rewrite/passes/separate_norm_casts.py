"""SeparateNormCasts: no Cast begins a decomposed LayerNorm that ONNX Runtime would fuse wrongly."""

from __future__ import annotations

from collections import Counter, defaultdict

import onnx
from onnx import helper

from amp_rewrite.ir.builder import Names
from amp_rewrite.rewrite.analysis import Analysis

MIN_OPSET = 5
"""Reshape reads its target as an input from opset 5."""


class SeparateNormCasts:
    """Invariant: no Cast node's output is read only by the ReduceMean and the Sub (or two)
    that begin a decomposed LayerNorm (``mean = ReduceMean(x); d = Sub(x, mean)``). Where one
    was, ``x`` goes through a Reshape to its own shape, which costs no copy.

    ONNX Runtime's LayerNormFusion (on by default, every provider) takes such a leading Cast
    into the fused LayerNormalization and feeds it the Cast's input: a float16 input beside
    float32 scale and bias, which ONNX's LayerNormalization (opset 17 on) refuses, or an
    integer one, which every opset refuses, so the session is never created (ONNX Runtime
    1.31.1: "Type parameter (T) of Optype (LayerNormalization) bound to different types").
    Both come from mixed precision: a float32 LayerNorm after a float16 producer, or a model's
    Cast of an integer mask whose float16 readers now read their own Cast. Behind the Reshape,
    ONNX Runtime fuses a float32 LayerNormalization of the Cast's output.
    """

    def run(self, analysis: Analysis) -> int:
        """Separate every such Cast; returns how many."""
        index = analysis.index
        if index.opsets.get("", 1) < MIN_OPSET:
            return 0
        candidates: dict[int, list[onnx.NodeProto]] = defaultdict(list)
        for node in index.nodes:
            if node.op_type == "ReduceMean" and node.domain == "" and node.proto.input:
                candidates[node.graph].append(node.proto)
        names: Names | None = None
        separated = 0
        for graph_id, means in candidates.items():
            graph = index.graphs[graph_id].proto
            # from the last: the positions of earlier ones stay valid
            for position, name, readers in sorted(_leading_casts(graph, means), reverse=True):
                names = names or Names.of_model(index.model)
                shape, kept = names.fresh(f"{name}_shape"), names.fresh(f"{name}_unfused")
                for reader in readers:
                    reader.input[:] = [kept if n == name else n for n in reader.input]
                graph.node.insert(position, helper.make_node("Reshape", [name, shape], [kept],
                                                             name=names.fresh(f"{kept}_reshape")))
                graph.node.insert(position, helper.make_node("Shape", [name], [shape],
                                                             name=names.fresh(f"{shape}_node")))
                separated += 1
        if separated:
            analysis.notes.append(f"{separated} decomposed LayerNorm(s) read their Cast input through a Reshape that "
                                  "keeps its shape: ONNX Runtime's LayerNormFusion would otherwise fuse the Cast "
                                  "into a LayerNormalization of mixed types and refuse the model")
        return separated


def _leading_casts(graph: onnx.GraphProto, means: list[onnx.NodeProto]) -> list[tuple[int, str, list[onnx.NodeProto]]]:
    """(position of its first reader, name, its readers) for each Cast output of ``graph`` (not
    a graph output) that only one of ``means`` and Subs of it less that mean read."""
    watched = {mean.input[0]: mean.output[0] for mean in means}  # by name: InsertCasts may have copied the nodes
    casts, readers, first = set(), defaultdict(list), {}
    for position, node in enumerate(graph.node):
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.output[0] in watched:
            casts.add(node.output[0])
        for name in node.input:
            if name in watched:
                readers[name].append(node)
                first.setdefault(name, position)
    found = []
    for name in casts - {info.name for info in graph.output}:
        mean = watched[name]
        kinds = Counter("mean" if r.op_type == "ReduceMean" and r.output[0] == mean else
                        "sub" if r.op_type == "Sub" and list(r.input) == [name, mean] else "other"
                        for r in readers[name])
        if kinds["mean"] == 1 and kinds["sub"] and not kinds["other"]:
            found.append((first[name], name, readers[name]))
    return found
