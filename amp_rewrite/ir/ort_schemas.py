"""Op schemas that ONNX Runtime registers and ``onnx.defs`` lacks, as bundled data.

These are the ``com.microsoft`` contrib ops (FusedMatMul, MultiHeadAttention,
SkipLayerNormalization, ...) and a few default-domain ones that only ONNX Runtime
defines (SimplifiedLayerNormalization). Without them a contrib node has no type
parameters, so it can be neither colored nor typed. ``data/ort-schemas-1.31.1.json``
was written by ``runtime.registry.schemas`` from onnxruntime 1.31.1 (the version of the kernel tables);
it is bundled rather than read live so that a model converts the same whichever
onnxruntime, or none, is installed. Regenerate with
``python -m amp_rewrite.runtime.registry schemas > amp_rewrite/ir/data/ort-schemas-VERSION.json``.

A schema has the attributes of ``onnx.defs.OpSchema`` that ``schemas.signature``
reads (``inputs[i].type_str``, ``type_constraints[i].type_param_str`` and
``.allowed_type_strs``), so both sources are read by one code path.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

BUNDLED = "ort-schemas-1.31.1.json"
DOMAINS = ("", "com.microsoft")
"""Domains taken from ONNX Runtime; its internal layout domains (NHWC, NCHWc) never appear in a saved model."""


@dataclass(frozen=True)
class Formal:
    type_str: str


@dataclass(frozen=True)
class TypeConstraint:
    type_param_str: str
    allowed_type_strs: tuple[str, ...]


@dataclass(frozen=True)
class OrtSchema:
    domain: str
    name: str
    since_version: int
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]
    type_constraints: tuple[TypeConstraint, ...]


def ort_schema(domain: str, op_type: str, opset: int) -> OrtSchema | None:
    """The newest bundled schema of (domain, op) with a since version at most ``opset``, or None."""
    found = [s for s in _schemas().get((domain, op_type), ()) if s.since_version <= opset]
    return max(found, key=lambda s: s.since_version) if found else None


@functools.cache
def _schemas() -> dict[tuple[str, str], list[OrtSchema]]:
    data = json.loads(resources.files("amp_rewrite.ir.data").joinpath(BUNDLED).read_text())
    by_op: dict[tuple[str, str], list[OrtSchema]] = {}
    for e in data["schemas"]:
        schema = OrtSchema(
            e["domain"], e["op"], e["since"],
            tuple(Formal(t) for t in e["inputs"]), tuple(Formal(t) for t in e["outputs"]),
            tuple(TypeConstraint(k, tuple(v)) for k, v in e["type_constraints"].items()),
        )
        by_op.setdefault((schema.domain, schema.name), []).append(schema)
    return by_op
