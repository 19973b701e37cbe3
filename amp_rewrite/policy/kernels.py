"""Which ops an ONNX Runtime execution provider implements in low precision.

Tables have the layout of ``data/cuda-1.31.1.json`` (see ``data/README.md``):
one entry per (domain, op, opset range) with the element types of each type
constraint. The CUDA table ships with the package (it was read from the
onnxruntime-gpu 1.31.1 wheel without a GPU). For the CPU provider the live
registry of the installed onnxruntime is read in a child process, because
onnxruntime-gpu crashes while listing kernels on a machine without CUDA
libraries; the bundled CPU table of onnxruntime 1.31.1 is the fallback.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources

import onnx
from onnx import helper

BUNDLED = {
    "CUDAExecutionProvider": "cuda-1.31.1.json",
    "CPUExecutionProvider": "cpu-1.31.1.json",
}
PROVIDERS = tuple(BUNDLED)
INLINED = {("", "CastLike"): (("", "Cast"),),
           ("", "Swish"): (("", "Sigmoid"), ("", "Mul")),
           ("", "Mish"): (("", "Softplus"), ("", "Tanh"), ("", "Mul"))}
"""ONNX functions that a provider registers no kernel for: ONNX Runtime inlines their function
body, whose ops (named here, with the same type constraint names) run them, so the function has
a kernel for a type where every op of its body has one. benchmarks/kernel_check.py saw CastLike
run as a Cast in float16 on the CPU, and Swish (opset 24) and Mish (opset 22) run their bodies in
float16 on CUDA with no inserted cast (onnxruntime-gpu 1.31.1)."""

REFUSED_ATTRIBUTES: dict[str, dict[tuple[str, str], tuple[str, frozenset[str], frozenset[str]]]] = {
    "CPUExecutionProvider": {
        ("", "ScatterND"): ("reduction", frozenset({"add", "mul", "max", "min"}), frozenset({"float16"})),
        ("", "ScatterElements"): ("reduction", frozenset({"add", "mul"}), frozenset({"float16"})),
    },
    "CUDAExecutionProvider": {
        ("", "ScatterND"): ("reduction", frozenset({"add", "mul", "max", "min"}), frozenset({"bfloat16"})),
    },
}
"""Kernels registered for a low type that refuse it at run time for some values of an attribute:
(attribute, refused values, types) by op, per provider. Seen by benchmarks/kernel_check.py in ONNX
Runtime 1.31.1: the CPU kernels ("MLFloat16 data type is not supported with ScatterND opset 16 when
reduction is 'add'"), and the CUDA ScatterND with a reduction in bfloat16 ("element_type 16 not
implemented for ScatterND operator"; float16 and ScatterElements run)."""


@dataclass(frozen=True)
class KernelEntry:
    since: int
    until: int | None
    types: frozenset[str]
    constraints: dict[str, frozenset[str]]


class KernelTable:
    """Looks up whether a provider registers a kernel for (domain, op, opset, type)."""

    def __init__(self, provider: str, entries: list[dict], source: str) -> None:
        self.provider = provider
        self.source = source
        self._by_op: dict[tuple[str, str], list[KernelEntry]] = {}
        for e in entries:
            if e.get("internal"):
                continue
            key = (_domain(e["domain"]), e["op"])
            self._by_op.setdefault(key, []).append(KernelEntry(
                e["since"], e["until"], frozenset(e["types"]),
                {k: frozenset(v) for k, v in (e.get("type_constraints") or {}).items()},
            ))

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (tables live for the process)
    def supports(self, domain: str, op: str, opset: int, type_name: str, params: frozenset[str]) -> bool:
        """True if a kernel covers ``opset`` with ``type_name`` (e.g. "float16") for ``params``."""
        key = (_domain(domain), op)
        if key not in self._by_op and key in INLINED:
            return all(self.supports(*body_op, opset, type_name, params) for body_op in INLINED[key])
        for entry in self._by_op.get(key, ()):
            if entry.since <= opset and (entry.until is None or opset <= entry.until):
                if "any" in entry.types:
                    return True
                named = [entry.constraints[p] for p in params if p in entry.constraints]
                pool = named or [entry.types]
                return all(type_name in types for types in pool)
        return False

    def refuses(self, node: onnx.NodeProto, type_name: str) -> str | None:
        """The attribute setting (``reduction='add'``) of ``node`` for which the provider's
        ``type_name`` kernel refuses to run (``REFUSED_ATTRIBUTES``); None when it runs."""
        limit = REFUSED_ATTRIBUTES.get(self.provider, {}).get((_domain(node.domain), node.op_type))
        if limit is None or type_name not in limit[2]:
            return None
        name, refused, _ = limit
        value = next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)
        value = value.decode() if isinstance(value, bytes) else value
        return f"{name}={value!r}" if value in refused else None


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


@functools.cache
def kernel_table(provider: str) -> KernelTable:
    """The kernel table for ``provider`` (live registry for CPU, bundled table for CUDA)."""
    if provider == "CPUExecutionProvider":
        live = _live_entries(provider)
        if live is not None:
            return KernelTable(provider, live, "live registry of the installed onnxruntime")
    name = BUNDLED[provider]
    data = json.loads(resources.files("amp_rewrite.policy.data").joinpath(name).read_text())
    return KernelTable(provider, data["kernels"], f"bundled table {name} (onnxruntime {data['onnxruntime']})")


def _live_entries(provider: str) -> list[dict] | None:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "amp_rewrite.runtime.registry", "kernels", provider],
            capture_output=True, text=True, timeout=120, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return json.loads(done.stdout)
