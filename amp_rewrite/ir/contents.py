"""What a model file holds, checked before anything reads it: every name is text, and every
tensor holds what it claims (``embedded``, ``external``). Model files are untrusted
(docs/security.md): a name that is not UTF-8 would reach readers as bytes, and a tensor's claims
decide what is read and allocated."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from amp_rewrite.errors import UserError, printable
from amp_rewrite.ir import embedded, external
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import SOURCE_TYPE_KEY, close_data_file, data_file, external_location


def check(model: onnx.ModelProto, base_dir: Path) -> None:
    """Every name is text and every tensor holds what it claims before any is read: an embedded
    one (an initializer or a node's tensor attribute, in any graph) the values of its type and shape
    (``embedded``); an external one a regular file inside the model's folder (no link, nothing
    outside it) with the bytes its offset, length, type and shape declare (``external``; the tensors
    a borrowing load placed in the model's own file too)."""
    _text("the model's opset imports", *(o.domain for o in model.opset_import))
    for function in model.functions:
        _text(f"function {printable(str(function.name))!r}", function.name, function.domain, *function.input,
              *function.output, *function.attribute)
        _check_node_names(function.node)
    sizes: dict[str, int] = {}  # by location: a file looked at once
    for graph in iter_graphs(model.graph):
        _check_names(graph)
        for tensor in graph.initializer:
            _text(f"the external data of initializer {printable(str(tensor.name))!r}",
                  *(field for entry in tensor.external_data for field in (entry.key, entry.value)))
            info = external_location(tensor)
            if info is None:
                embedded.check(tensor, "initializer")
                continue
            if SOURCE_TYPE_KEY in info:
                raise external.UnsafeExternalData(tensor.name, info.get("location", ""),
                                                  f"carries {SOURCE_TYPE_KEY}, amp-rewrite's own mark for a "
                                                  "conversion under way, which no saved model holds")
            location = info.get("location", "")
            if location not in sizes:
                sizes[location] = os.stat(external.resolve(base_dir, location, tensor.name)).st_size
                close_data_file(base_dir / location)  # a kept descriptor may be of a file since replaced
            external.extent(tensor, info, sizes[location])
        for node in graph.node:
            for attr in node.attribute:
                for tensor in (attr.t, ) if attr.HasField("t") else attr.tensors:
                    _text(f"a tensor of node {printable(node.name)!r}", tensor.name)
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        raise external.UnsafeExternalData(tensor.name, data_file(tensor) or "",
                                                          f"is named by node {printable(node.name)!r}'s attribute: "
                                                          "only initializers may hold external data")
                    embedded.check(tensor, f"node {printable(node.name)!r}'s tensor")


def _check_names(graph: onnx.GraphProto) -> None:
    """The graph's names are text: protobuf hands a string field that is not UTF-8 back as bytes,
    which no reader of a name expects (node, value and attribute names, op types and domains, and
    the dimension names of declared types)."""
    _check_node_names(graph.node)
    for value in (*graph.input, *graph.output, *graph.value_info):
        _text(f"value {printable(str(value.name))!r}", value.name, *_dim_names(value.type))
    _text(f"graph {printable(str(graph.name))!r}", graph.name, *(t.name for t in graph.initializer),
          *(name for t in graph.sparse_initializer for name in (t.values.name, t.indices.name)))


def _check_node_names(nodes) -> None:
    for node in nodes:
        _text(f"node {printable(str(node.name))!r}", node.name, node.op_type, node.domain, *node.input, *node.output,
              *(a.name for a in node.attribute))


def _dim_names(type_proto: onnx.TypeProto) -> Iterator[str | bytes]:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        yield from (d.dim_param for d in getattr(type_proto, kind).shape.dim)
    elif kind in ("sequence_type", "optional_type"):
        yield from _dim_names(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        yield from _dim_names(type_proto.map_type.value_type)


def _text(owner: str, *names: str | bytes) -> None:
    bad = next((n for n in names if isinstance(n, bytes)), None)
    if bad is not None:
        raise UserError(f"{owner} holds a name that is not UTF-8 text: "
                        f"{printable(bad.decode('utf-8', 'backslashreplace'))!r}")
