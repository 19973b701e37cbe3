"""``amp-rewrite inspect``: print the coloring and the reason for each decision; writes nothing."""

from __future__ import annotations

import argparse
import json
import os

from amp_rewrite.cli.common import EXIT_OK, coloring_arguments, convert_options
from amp_rewrite.errors import UserError, printable, printable_lines
from amp_rewrite.ir.io import load
from amp_rewrite.workflows.analyze import analyze


def add_parser(commands) -> None:
    insp = commands.add_parser("inspect", help="print the coloring and its reasons; nothing is written")
    insp.add_argument("input")
    insp.add_argument("--explain", metavar="NODE", help="explain one node's decision")
    insp.add_argument("--json", action="store_true", help="print the decisions as JSON")
    coloring_arguments(insp)


def run(args: argparse.Namespace) -> int:
    options = convert_options(args)
    model = load(args.input)
    analysis = analyze(model, options, os.path.dirname(os.path.abspath(args.input)))
    rows = [(n.label, n.op_type, d.op_class, (d.color.value if d.color else "fp32"), d.reason)
            for n, d in ((analysis.index.nodes[i], d) for i, d in sorted(analysis.coloring.decisions.items()))]
    if args.explain:
        print(_explain(analysis, args.explain))
    elif args.json:
        print(json.dumps([dict(zip(("node", "op_type", "class", "precision", "reason"), r)) for r in rows], indent=1))
    else:
        width = max((len(r[0]) for r in rows), default=4)
        for name, op, cls, color, reason in rows:
            print(printable(f"{name:<{width}}  {op:<20} {cls:<7} {color:<4}  {reason}"))
        print(f"{sum(r[3] == 'low' for r in rows)} of {len(rows)} float nodes in {options.precision}; "
              f"range check: {analysis.range_check}")
    return EXIT_OK


def _explain(analysis, wanted: str) -> str:
    index = analysis.index
    node = next((n for n in index.nodes if n.proto.name == wanted or n.label == wanted), None)
    if node is None:
        raise UserError(f"no node named {wanted!r} in the model")
    decision = analysis.coloring.decisions.get(node.id)
    lines = [f"node {node.label} ({node.qualified_op}, opset {index.opset(node)})"]
    if decision is None:
        lines.append("  not a candidate: no float32 input or output it could change "
                     "(no schema type parameter admitting the target type)")
        return printable_lines(lines)
    lines.append(f"  class: {decision.op_class}")
    decided_by = "min cut over its neighbours" if decision.free else decision.priority.name.lower()
    lines.append(f"  precision: {(decision.color.value if decision.color else 'fp32')} (decided by {decided_by})")
    lines.append(f"  reason: {decision.reason}")
    slots = analysis.slots[node.id]
    for label, keys, chosen in (("input", node.inputs, slots.inputs), ("output", node.outputs, slots.outputs)):
        for i, key in enumerate(keys):
            if key is not None:
                mark = "converted with the node" if i in chosen else "keeps its type"
                lines.append(f"  {label} {i}: {key[1]} ({mark})")
    return printable_lines(lines)
