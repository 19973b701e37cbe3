"""The configuration that ``convert`` takes; the CLI only builds one of these.

``ConvertOptions`` is flat, as users and the CLI write it; its views split it by concern
(``coloring``, ``measurement``, ``validation``, ``output``), and each pass and workflow reads the
view it needs alone.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, overload

import onnx
import onnx.defs

from amp_rewrite.errors import UserError
from amp_rewrite.ir.precision import Precision
from amp_rewrite.numerics.compare import Tolerance
from amp_rewrite.policy.kernels import PROVIDERS

UNKNOWN_OP_MODES = ("keep", "warn", "error")
POLICIES = ("default", "all-low")
RANGE_CHECK_MODES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class ColoringOptions:
    """What decides each node's color apart from measurements: the target precision, the
    provider's kernels, the policy, and the user's overrides (``ConvertOptions`` says what each means)."""

    precision: Precision
    provider: str | None
    keep_io_types: bool
    keep_fp32_ops: Sequence[str]
    keep_fp32_nodes: Sequence[str]
    force_low_ops: Sequence[str]
    force_low_nodes: Sequence[str]
    unknown_ops: str
    policy: str
    fp32_residual_stream: bool


@dataclass(frozen=True, slots=True)
class MeasurementOptions:
    """Which values are judged, on what data, and against which thresholds: the constants'
    fit (``underflow_share``) and the range check's or calibration's measured values, all
    against the target ``precision``."""

    precision: Precision
    range_check: str
    range_check_max_bytes: int
    headroom: float
    underflow_share: float
    seed: int
    shapes: Mapping[str, Sequence[int]]
    inputs: Sequence
    calibrate: Sequence
    flush_share: float


@dataclass(frozen=True, slots=True)
class ValidationOptions:
    """The check of the converted model against the float32 one, emulating ``precision``,
    and how many conversion rounds it may ask for."""

    precision: Precision
    validate: Sequence
    tolerance: Tolerance
    tolerances: Mapping[str, Tolerance]
    max_rounds: int


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """What the output model declares: its default-domain opset and IR version."""

    ir_version: int | None
    opset: int | None


View = TypeVar("View", ColoringOptions, MeasurementOptions, ValidationOptions, OutputOptions)


class _ViewOf(Generic[View]):
    """An attribute of ``ConvertOptions``: its fields that the dataclass ``view`` names, as a
    ``view`` (``precision`` as its member), made on first use and kept in the instance."""

    def __init__(self, view: type[View]) -> None:
        self.view: type[View] = view

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, options: None, owner: type) -> _ViewOf[View]:
        ...

    @overload
    def __get__(self, options: ConvertOptions, owner: type | None = None) -> View:
        ...

    def __get__(self, options: ConvertOptions | None, owner: type | None = None) -> View | _ViewOf[View]:
        if options is None:
            return self
        values = {f.name: getattr(options, f.name) for f in dataclasses.fields(self.view)}
        if "precision" in values:
            values["precision"] = Precision(options.precision)
        made = options.__dict__[self.name] = self.view(**values)
        return made


@dataclass
class ConvertOptions:
    """Options of :func:`amp_rewrite.convert`.

    - ``precision``: "float16" or "bfloat16".
    - ``provider``: execution provider whose kernels decide what may run in low
      precision ("CUDAExecutionProvider", "CPUExecutionProvider"), or None to
      follow the ONNX schemas alone.
    - ``keep_io_types``: graph inputs and outputs stay float32.
    - ``keep_fp32_ops`` / ``keep_fp32_nodes``: op types, node names or name
      regular expressions kept in float32; ``force_low_ops`` / ``force_low_nodes``
      put others in low precision whatever the lists say.
    - ``unknown_ops``: ops the lists don't know: "keep" float32, "warn", or "error".
    - ``policy``: "default", or "all-low" to put every convertible node in low
      precision as other converters do (safety checks still apply).
    - ``fp32_residual_stream``: the sums of a residual stream stay float32
      (``KeepResidualStream``; what a training step's rewrite asks for).
    - ``range_check``: run the model on generated inputs and keep nodes whose
      values leave the target's range in float32: "auto" (models up to
      ``range_check_max_bytes`` of weights), "on" or "off". The inputs' named
      dimensions take the extents the graph implies (a Reshape to a fixed shape);
      when the model does not run on those, a few other extents are tried.
    - ``shapes``: input name -> dimensions of that generated input (its named
      dimensions take these extents in every input); they win over what the graph implies.
    - ``inputs``: samples (.npz paths or dicts of arrays) to run the range check on
      instead of generated inputs; unlike ``calibrate``, only overflow is judged.
      ``shapes`` or ``inputs`` turn the range check on.
    - ``headroom``: measured magnitudes above ``precision max / headroom`` count
      as overflow (generated inputs can be narrower than real data).
    - ``underflow_share``: a constant whose values that flush to zero carry more
      than this share of its L2 norm keeps its readers in float32.
    - ``calibrate``: samples (.npz paths or dicts of arrays) to measure the float32
      model's values on; a value that overflows (beyond ``precision max / headroom``)
      or of whose nonzero elements more than ``flush_share`` flush to zero keeps the
      nodes that produce and read it in float32. Replaces the generated-input range check.
    - ``validate``: samples on which the converted model is checked against the
      float32 one (emulating the target precision) with ``tolerance`` (and per-output
      ``tolerances``; rtol and atol not given are the precision's default); while it fails, the
      nodes localization blames are kept float32 and the model is converted again, at most
      ``max_rounds`` times.
    - ``opset``: upgrade the model to this default-domain opset first (onnx's version
      converter); bfloat16 upgrades a model below opset 13 by itself, where its ops allow.
    - ``ir_version``: the IR version the output declares (default: the input's), for a
      runtime that reads only older ones; at least what the model's opsets need.

    The views ``coloring``, ``measurement``, ``validation`` and ``output`` group these fields
    by concern (each made once, on first use: change options with ``dataclasses.replace``,
    which makes new ones, rather than in place).
    """

    precision: Precision | str = Precision.FLOAT16
    provider: str | None = "CUDAExecutionProvider"
    keep_io_types: bool = True
    keep_fp32_ops: list[str] = field(default_factory=list)
    keep_fp32_nodes: list[str] = field(default_factory=list)
    force_low_ops: list[str] = field(default_factory=list)
    force_low_nodes: list[str] = field(default_factory=list)
    unknown_ops: str = "keep"
    policy: str = "default"
    fp32_residual_stream: bool = False
    range_check: str = "auto"
    range_check_max_bytes: int = 1 << 30
    headroom: float = 16.0
    underflow_share: float = 0.01
    seed: int = 0
    shapes: dict[str, Sequence[int]] = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    calibrate: list = field(default_factory=list)
    flush_share: float = 0.05
    validate: list = field(default_factory=list)
    tolerance: Tolerance = field(default_factory=Tolerance)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    max_rounds: int = 8
    ir_version: int | None = None
    opset: int | None = None

    def validated(self) -> ConvertOptions:
        """Return a copy with enums resolved; raise UserError on a bad value."""
        try:
            precision = Precision(self.precision)
        except ValueError:
            raise UserError(f"unknown precision {self.precision!r}; choose float16 or bfloat16") from None
        _choose("provider", self.provider, (*PROVIDERS, None))
        _choose("unknown_ops", self.unknown_ops, UNKNOWN_OP_MODES)
        _choose("policy", self.policy, POLICIES)
        _choose("range_check", self.range_check, RANGE_CHECK_MODES)
        for pattern in (*self.keep_fp32_nodes, *self.force_low_nodes):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UserError(f"node pattern {pattern!r} is not a valid regular expression: {exc}") from None
        if self.ir_version is not None and not 3 <= self.ir_version <= onnx.IR_VERSION:
            raise UserError(f"ir_version must be between 3 and {onnx.IR_VERSION} (the newest this onnx writes), "
                            f"got {self.ir_version}")
        if self.opset is not None and not 7 <= self.opset <= onnx.defs.onnx_opset_version():
            raise UserError(f"opset must be between 7 and {onnx.defs.onnx_opset_version()} (the newest this onnx "
                            f"knows), got {self.opset}")
        if not 0 <= self.flush_share <= 1:
            raise UserError(f"flush_share must be between 0 and 1, got {self.flush_share}")
        if self.headroom < 1:
            raise UserError(f"headroom must be at least 1, got {self.headroom}")
        if isinstance(self.inputs, (str, os.PathLike, Mapping)) or not all(
                isinstance(item, (str, os.PathLike, Mapping)) for item in self.inputs):
            raise UserError("inputs must be a list of .npz paths or dicts of arrays")
        return dataclasses.replace(self, precision=precision, shapes=_shapes(self.shapes),
                                   range_check=self._range_check(),
                                   tolerance=self.tolerance.resolved(precision.value),
                                   tolerances={k: t.resolved(precision.value) for k, t in self.tolerances.items()})

    coloring = _ViewOf(ColoringOptions)
    measurement = _ViewOf(MeasurementOptions)
    validation = _ViewOf(ValidationOptions)
    output = _ViewOf(OutputOptions)

    def _range_check(self) -> str:
        """The range-check mode: "on" when the user gave its inputs or their shapes."""
        given = "inputs" if self.inputs else "shapes" if self.shapes else None
        if given is None:
            return self.range_check
        used = "calibrate" if self.calibrate else "validate" if self.validate else None
        if used:
            raise UserError(f"{given} set the range check's inputs, but it runs on the {used} samples; "
                            f"pass those samples as {used}")
        if self.inputs and self.shapes:
            raise UserError("shapes set generated inputs, but inputs are given; pass one of them")
        if self.range_check == "off":
            raise UserError(f"{given} set the range check's inputs, but range_check is off")
        return "on"


def _shapes(shapes) -> dict[str, Sequence[int]]:
    try:
        checked: dict[str, Sequence[int]] = {str(name): tuple(operator.index(d) for d in dims)
                                             for name, dims in dict(shapes).items()}
    except (TypeError, ValueError):
        raise UserError(f"shapes must map input names to lists of integers, got {shapes!r}") from None
    for name, dims in checked.items():
        if any(d < 0 for d in dims):
            raise UserError(f"shape of input {name!r} has a negative dimension: {list(dims)}")
    return checked


def _choose(name: str, value, allowed) -> None:
    if value not in allowed:
        shown = ", ".join(str(a) for a in allowed if a is not None)
        raise UserError(f"unknown {name} {value!r}; choose one of: {shown}")


def matches_node(name: str, patterns: Sequence[str]) -> str | None:
    """The first pattern equal to ``name`` or fully matching it as a regex."""
    for pattern in patterns:
        if pattern == name or re.fullmatch(pattern, name):
            return pattern
    return None

