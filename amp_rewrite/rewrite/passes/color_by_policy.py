"""ColorByPolicy: class every candidate and fix the colors that policy alone decides."""

from __future__ import annotations

from amp_rewrite.errors import UserError
from amp_rewrite.ir.graph import node_key
from amp_rewrite.policy.classes import OpClass
from amp_rewrite.policy.kernels import kernel_table
from amp_rewrite.policy.oplists import ALLOW, DENY, INFER
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.norms import pooled_statistic
from amp_rewrite.rewrite.options import ColoringOptions, matches_node
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class ColorByPolicy(Pass[Analysis]):
    """Invariant: every candidate has an op class; user overrides are fixed (USER),
    nodes the provider has no low-precision kernel for, or whose kernel refuses their
    attributes (``REFUSED_ATTRIBUTES``), are fixed float32 (SAFETY),
    allow ops are fixed low and deny and unknown ops float32 (POLICY); infer and clear
    ops stay free, but an op that only a measurement makes infer (``MEASURED_CLASSES``) and
    that a deny op reads is deny, and so is a GlobalAveragePool that computes a written-out
    norm's mean or mean square (``norms.pooled_statistic``), as the ReduceMean it stands for is.
    """

    def __init__(self, options: ColoringOptions) -> None:
        self.options = options

    def run(self, analysis: Analysis) -> PassResult:
        options, index, coloring = self.options, analysis.index, analysis.coloring
        before = coloring.changes
        table = kernel_table(options.provider) if options.provider else None
        user = any((options.keep_fp32_nodes, options.keep_fp32_ops, options.force_low_nodes, options.force_low_ops))
        precision = analysis.precision.value
        unknown: set[str] = set()
        classes: dict[tuple[str, str], OpClass | None] = {}
        for node_id, slots in analysis.slots.items():
            node = index.nodes[node_id]
            op = (node.domain, node.op_type)
            op_class = classes[op] if op in classes else classes.setdefault(op, analysis.policy.classify(*op))
            coloring.add(node_id, op_class.name if op_class else "unknown")
            if user:
                self._user(analysis, node_id)
            if table is not None and not table.supports(
                node.domain, node.op_type, index.opset(node), precision, slots.params
            ):
                coloring.fix(node_id, Color.FP32, f"{options.provider} has no {precision} "
                             f"kernel for {node.op_type} at opset {index.opset(node)}", Priority.SAFETY)
            elif table is not None and (refused := table.refuses(node.proto, precision)):
                coloring.fix(node_id, Color.FP32, f"{options.provider}'s {precision} {node.op_type} kernel "
                             f"refuses {refused} at run time", Priority.SAFETY)
            if op_class is None:
                op_name = node.qualified_op
                unknown.add(op_name)
                analysis.unknown_ops[op_name] += 1
                coloring.fix(node_id, Color.FP32, f"{op_name} is not in the op lists; kept float32 "
                             f"(unknown_ops={options.unknown_ops})", Priority.POLICY)
            elif op_class.name == ALLOW:
                coloring.fix(node_id, Color.LOW, f"allow: {op_class.reason}", Priority.POLICY)
            elif op_class.name == DENY:
                coloring.fix(node_id, Color.FP32, f"deny: {op_class.reason}", Priority.POLICY)
        self._deny_measured_ops_that_deny_ops_read(analysis)
        self._deny_pooled_norm_statistics(analysis)
        unknown.update(op for op in analysis.unknown_ops if "." in op)
        if unknown and options.unknown_ops == "error":
            raise UserError(f"ops not in the precision lists: {', '.join(sorted(unknown))} "
                            "(use --unknown-ops keep or warn, or --keep-fp32-op/--force-low-op)")
        notes: tuple[str, ...] = ()
        if unknown and options.unknown_ops == "warn":
            notes = (f"warning: ops not in the precision lists kept float32: {', '.join(sorted(unknown))}",)
        return PassResult(coloring.changes != before, notes)

    def _deny_measured_ops_that_deny_ops_read(self, analysis: Analysis) -> None:
        """An op that a measurement made infer (``MEASURED_CLASSES``) and a deny op reads is deny:
        a norm's square feeds the ReduceMean of its variance, and an overflow there on data the
        range check did not see would collapse the statistic."""
        decisions, nodes = analysis.coloring.decisions, analysis.index.nodes
        for node_id in [n for n in decisions if analysis.measured_infer(n)]:
            outputs = (value for is_input, _, value in analysis.slot_values(node_id) if not is_input)
            reader = next((nodes[r] for value in outputs for r, _ in analysis.slot_readers(value)
                           if decisions[r].op_class == DENY), None)
            if reader is not None:
                analysis.deny(node_id, f"read by deny {reader.op_type} {reader.label!r}")

    def _deny_pooled_norm_statistics(self, analysis: Analysis) -> None:
        """A GlobalAveragePool that tf2onnx wrote for a norm's ReduceMean is deny, as the ReduceMean
        is: a float16 variance overflows where |x - mean| > 256, and rounds a small one away."""
        for node_id, decision in analysis.coloring.decisions.items():
            node = analysis.index.nodes[node_id]
            if decision.op_class == INFER and decision.free and (found := pooled_statistic(analysis, node)):
                analysis.deny(node_id, f"a written-out norm's {found}", like="ReduceMean")

    def _user(self, analysis: Analysis, node_id: int) -> None:
        options, node = self.options, analysis.index.nodes[node_id]
        name = node_key(node)
        for patterns, ops, color, flag in (
            (options.keep_fp32_nodes, options.keep_fp32_ops, Color.FP32, "keep-fp32"),
            (options.force_low_nodes, options.force_low_ops, Color.LOW, "force-low"),
        ):
            pattern = matches_node(name, patterns) if name else None
            if pattern is not None:
                reason = f"--{flag}-node {pattern}"
            elif node.op_type in ops:
                reason = f"--{flag}-op {node.op_type}"
            else:
                continue
            analysis.coloring.fix(node_id, color, f"user override {reason}", Priority.USER)
            return
