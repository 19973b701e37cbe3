"""What the installed onnxruntime registers, read for the tables amp-rewrite bundles: its kernels
per execution provider (``policy.kernels``'s layout) and the op schemas ``onnx.defs`` lacks
(``ir.ort_schemas``'s layout).

The layers beneath read those tables as data and never import onnxruntime: ``policy.kernels``
reads the live CPU registry by running this module in a child process (onnxruntime-gpu crashes
listing its kernels on a machine without CUDA libraries), and the bundled files are regenerated
with it:

    python -m amp_rewrite.runtime.registry kernels CPUExecutionProvider
    python -m amp_rewrite.runtime.registry schemas > amp_rewrite/ir/data/ort-schemas-VERSION.json
"""

from __future__ import annotations

import json
import sys

import onnx
import onnx.defs
import onnxruntime
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from amp_rewrite.ir import ort_schemas


def kernels(provider: str) -> list[dict]:
    """Read the installed onnxruntime's kernel registry for ``provider`` in the table layout."""
    merged: dict[tuple, dict] = {}
    for d in ort_state.get_all_opkernel_def():
        if d.provider != provider:
            continue
        since, until = d.version_range
        key = (d.domain, d.op_name, since, None if until >= 2**31 - 1 else until)
        entry = merged.setdefault(key, {"domain": d.domain, "op": d.op_name, "since": key[2],
                                        "until": key[3], "type_constraints": {}})
        for name, types in d.type_constraints.items():
            bucket = entry["type_constraints"].setdefault(name, set())
            bucket.update(t.removeprefix("tensor(").removesuffix(")") for t in types)
    entries = []
    for entry in merged.values():
        constraints = {k: sorted(v) for k, v in entry["type_constraints"].items()}
        types = sorted({t for v in constraints.values() for t in v}) or ["any"]
        entries.append({**entry, "types": types, "type_constraints": constraints})
    return sorted(entries, key=lambda e: (e["domain"], e["op"], e["since"]))


def schemas() -> dict:
    """The installed onnxruntime's schemas of ``DOMAINS`` that ``onnx.defs`` lacks, in the bundled layout."""
    schemas = [
        {"domain": s.domain, "op": s.name, "since": s.since_version,
         "inputs": [f.typeStr for f in s.inputs], "outputs": [f.typeStr for f in s.outputs],
         "type_constraints": {c.type_param_str: sorted(c.allowed_type_strs) for c in s.type_constraints}}
        for s in ort_state.get_all_operator_schema()
        if s.domain in ort_schemas.DOMAINS and not onnx.defs.has(s.name, s.domain)
    ]
    return {
        "onnxruntime": onnxruntime.__version__,
        "source": "onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema(), the schemas of "
                  f"domains {list(ort_schemas.DOMAINS)} that onnx {onnx.__version__} does not define",
        "schemas": sorted(schemas, key=lambda e: (e["domain"], e["op"], e["since"])),
    }


def _main(argv: list[str]) -> None:
    if argv[:1] == ["kernels"] and len(argv) == 2:
        json.dump(kernels(argv[1]), sys.stdout)
    elif argv == ["schemas"]:
        table = schemas()
        rows = ",\n  ".join(json.dumps(e) for e in table.pop("schemas"))
        header = json.dumps(table, indent=1)[:-2]
        sys.stdout.write(f'{header},\n "schemas": [\n  {rows}\n ]\n}}\n')
    else:
        raise SystemExit("usage: python -m amp_rewrite.runtime.registry kernels PROVIDER | schemas")


if __name__ == "__main__":
    _main(sys.argv[1:])
