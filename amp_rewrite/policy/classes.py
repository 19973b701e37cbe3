"""A precision policy: the op lists of ``oplists`` refined for one provider and mode."""

from __future__ import annotations

from dataclasses import dataclass

from amp_rewrite.policy import oplists
from amp_rewrite.policy.oplists import ALLOW, DENY, INFER, OpKey, op_key


@dataclass(frozen=True)
class OpClass:
    name: str
    reason: str


class Policy:
    """Answers "which class is this op, and why" for one provider and policy mode."""

    def __init__(self, provider: str | None, mode: str = "default", measured: bool = False) -> None:
        """``measured``: the range check measures the model's values (``MEASURED_CLASSES`` apply)."""
        oplists.check_disjoint()
        self.mode = mode
        self._classes: dict[OpKey, OpClass] = {
            key: OpClass(cls, reason) for cls, ops in oplists.OP_CLASSES.items() for key, reason in ops.items()
        }
        refinements = {**oplists.PROVIDER_CLASSES.get(provider or "", {}),
                       **(oplists.MEASURED_CLASSES if measured else {})}
        for key, (cls, reason) in refinements.items():
            self._classes[key] = OpClass(cls, reason)

    def classify(self, domain: str, op_type: str) -> OpClass | None:
        """The class of ``op_type`` of ``domain`` (``""`` or ``ai.onnx`` for the default domain),
        or None when the lists don't know it."""
        found = self._classes.get(op_key(domain, op_type))
        if found is not None and self.mode == "all-low" and found.name in (DENY, INFER):
            # Compute ops are forced low; data movement (clear) still follows its neighbours.
            return OpClass(ALLOW, f"all-low policy ({found.name} op: {found.reason})")
        return found

    def keep_fp32_params(self, domain: str, op_type: str) -> dict[str, str]:
        return oplists.KEEP_FP32_TYPE_PARAMS.get(op_key(domain, op_type), {})
