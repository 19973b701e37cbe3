"""The trained model out: the model as given with the trained weights written back by the
adapters (``adapters.write_back``), checked against the trained step's forward before it is handed
over (``check_export``); and its mixed-precision rewrite (``mixed``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.inputs import samples
from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.specialize import RANDOM_OPS
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.report import Report, build_report
from amp_rewrite.runtime import instrument
from amp_rewrite.training import adapters
from amp_rewrite.training.adapters import encoders, float32_view
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.step import measured_rewrite

_EXPORT_RTOL = {TensorProto.FLOAT: 1e-4, TensorProto.DOUBLE: 1e-4, TensorProto.FLOAT16: 1e-2,
                TensorProto.BFLOAT16: 5e-2}
"""How far (relative to the output's largest magnitude) an exported model's output may stray from
the trained forward's, by its type: the same computation in another graph form (float32 sums
reordered), or rounded to the model's own float16."""
EXPORT_ATOL = 1e-5


def with_weights(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` (the model as given, or one of its lowered forms) holding ``weights``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    adapters.write_back(copy, weights)
    return copy


def check_export(exported: onnx.ModelProto, forward: onnx.ModelProto, given: list[str], batching: Batching,
                 encoding: encoders.Encoding, data: Mapping[str, np.ndarray], rows: int = 8) -> None:
    """That ``exported`` (the model as given with the trained weights written back: into
    initializers, Constant nodes, ai.onnx.ml attributes, float16 or float64 tensors, a fused ONNX
    Runtime graph) computes on ``rows`` samples of ``data`` the float outputs the trained
    ``forward`` computes: a UserError naming the output where they disagree. A model with random
    ops, or one ONNX Runtime cannot run, is not checked. ``data`` holds the model's string inputs
    as strings (``given``: the arrays the user's data holds): the exported model reads them, the
    forward what ``encoding`` makes of them."""
    if any(n.op_type in RANDOM_OPS for graph in iter_graphs(exported.graph) for n in graph.node):
        return
    feeds = batching.take(data, given, slice(0, rows))
    elem = {v.name: v.type.tensor_type.elem_type for v in (*exported.graph.input, *exported.graph.output)}
    fed = {name: np.asarray(feeds[name], helper.tensor_dtype_to_np_dtype(elem[name])) if elem[name] in FLOAT_TYPES
           else feeds[name] for name in samples.graph_inputs(exported) if name in feeds}
    try:
        session = instrument.session(exported)
        written = dict(zip((o.name for o in session.get_outputs()), session.run(None, fed)))
    except Exception:  # the input model itself may be one ONNX Runtime refuses
        return
    reference = instrument.session(forward)
    names = [o.name for o in reference.get_outputs() if elem.get(o.name) in _EXPORT_RTOL and o.name in written]
    for name, want in zip(names, reference.run(names, dict(encoding(feeds)))):
        got = np.asarray(written[name], np.float64)
        scale = float(np.max(np.abs(want))) if np.size(want) else 0.0
        if got.shape != np.shape(want) or np.any(np.abs(got - want) > _EXPORT_RTOL[elem[name]] * scale + EXPORT_ATOL):
            worst = float(np.max(np.abs(got - want))) if got.shape == np.shape(want) else float("nan")
            raise UserError(f"the exported model's output {name!r} differs from the trained step's (largest "
                            f"difference {worst:.3g}, outputs up to {scale:.3g}): the weights did not go back "
                            f"into the model as they were trained; nothing was written")


def mixed(original: onnx.ModelProto, weights: Mapping[str, np.ndarray],
          options: ConvertOptions | None) -> tuple[onnx.ModelProto, Report]:
    """The mixed-precision rewrite of ``original`` with ``weights``, with ``options``: the float32
    master weights go into its float32 view, which the rewrite takes."""
    view = onnx.ModelProto.FromString(original.SerializeToString())
    float32_view.lower(view)
    proto = with_weights(view, weights)
    analysis, stats = measured_rewrite(proto, (options or ConvertOptions()).validated())
    return proto, build_report(analysis, stats)
