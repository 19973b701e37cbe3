"""Input samples for running a model: read from .npz files, or generated to fit its inputs.

Generated inputs respect each input's element type and shape: a dimension with a
name (``batch``, ``seq``) takes one value shared by every input that names it, the
one the graph implies where it implies one (``inputs.dims``: a Reshape to a fixed
shape, a declared value_info) or that its name spells out (a cache's mask named
``past + seq``), ``shapes`` fixes an input's shape outright, and
integer inputs are drawn from a range that indexes whatever they index (a token id
feeding an embedding Gather stays below the vocabulary size; an input named like a
mask is all ones). ``attempts`` offers other extents in turn for a model that does
not run on the first.
"""

from __future__ import annotations

import ast
import math
import os
import re
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, NamedTuple, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError, printable
from amp_rewrite.inputs import dims as input_dims
from amp_rewrite.inputs import operands
from amp_rewrite.ir.functions import inlined
from amp_rewrite.ir.graph import ModelIndex, Node, Value
from amp_rewrite.ir.sizes import without_weights
from amp_rewrite.ir.tensors import constant_tensor

Sample = dict[str, np.ndarray]
T = TypeVar("T")

NAMED_DIM = 8
"""Extent given to a named (symbolic) dimension that neither ``shapes`` nor the graph fixes."""
UNNAMED_DIM = 1
MOST_SPELLED = 1 << 16
"""The largest extent a dimension's name may spell out (``batch * 1000000`` is taken as a name)."""
FALLBACK_DIMS = (1, 2, 4)
"""Extents tried in turn for the free dimensions when a model does not run on the defaults."""
SAMPLE_ELEMENTS = 1 << 18
"""The most elements one generated sample's inputs hold where free dimensions decide it: names
nothing binds are halved from NAMED_DIM until the sample fits (or they reach 1); the fallback
extents (FALLBACK_DIMS), tried when that does not run, are not capped. A batch of many
images makes the range check's run as many times longer, and says no more about value ranges
than one image does."""
LONGER_DIMS = (16, 128, 1024, 8192)
"""Extents tried last for the free dimensions that no input leads with (not the batch), and only
after a run failed inside the model
(``failed_inside``): ONNX Runtime names the node that refused its operand (a reflect Pad wider
than its axis, a window longer than the sequence), not the input extent that would do."""
LONGER_ORIGIN = "a longer extent after a run failed inside the model"
LONGER_ELEMENTS = 1 << 20
"""The most elements one sample of a LONGER_DIMS set may hold: a sequence of 8192 steps is one
thing, a 1024x1024 image through a network whose every value the range check keeps is another."""
SET_BYTES = 256 << 20
"""The most bytes one candidate set of generated samples may hold: a set past it is passed over
(an implied extent can be absurd: a batch bound to 10^9 through a Reshape's constant)."""
IMPLIED_FAILED = "the extents the graph implies could not be read"
"""Said in the line of each set drawn after ``input_dims`` failed on the model (a rule's bug)."""
INTEGER_HIGH = 4
"""Integer inputs that index nothing known are drawn from [0, INTEGER_HIGH)."""
MASK_NAME = re.compile(r"mask", re.IGNORECASE)

class _Indexes(NamedTuple):
    """An op input that indexes another (its ``data`` input): along the axis the attribute of
    that name gives (default 0), along a fixed axis (an int), or (None) along its leading axes,
    as many as the indices' last extent. Integer inputs drawn for it stay below that extent."""

    data: int
    axis: str | int | None


_INDEXING = {("Gather", 1): _Indexes(0, "axis"), ("GatherElements", 1): _Indexes(0, "axis"),
             ("ScatterElements", 1): _Indexes(0, "axis"), ("Scatter", 1): _Indexes(0, "axis"),
             ("GatherND", 1): _Indexes(0, None), ("ScatterND", 1): _Indexes(0, None),
             # ONNX Runtime's fused BERT embedding: word, segment and position ids index their tables
             ("EmbedLayerNormalization", 0): _Indexes(2, 0), ("EmbedLayerNormalization", 1): _Indexes(4, 0),
             ("EmbedLayerNormalization", 8): _Indexes(3, 0)}
# Integer inputs reach an indexing op through these type-preserving ops.
_PASS_THROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand",
                           "Transpose"})


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:DIMS`` with DIMS like ``1x128`` or ``1,128`` -> (name, dims)."""
    name, sep, dims = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in re.split(r"[x,]", dims) if d != "")
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise UserError(f"bad --shape {text!r}: expected NAME:DIMS such as input_ids:1x128") from None
    return name, shape


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, by name; a clear error for a missing or unreadable file, and for
    one holding Python objects, which would be unpickled to load (a data file may be anyone's)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise UserError(f"data file not found: {path}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        _refuse_objects(path, [n for n in _members(path) if n.endswith(".npy")])
        raise UserError(f"not a readable .npz file: {path} ({type(exc).__name__})") from None


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz file (``read_npz``), or of a folder's NAME.npy files opened memory-mapped
    (data larger than memory: a batch reads its rows)."""
    folder = Path(path)
    if not folder.is_dir():
        return read_npz(path)
    files = sorted(folder.glob("*.npy"))
    if not files:
        raise UserError(f"{path}: a data folder holds NAME.npy files, one per input and labels; it has none")
    try:
        return {f.stem: np.load(f, mmap_mode="r", allow_pickle=False) for f in files}
    except (OSError, ValueError) as exc:
        for file in files:
            _refuse_objects(file, [None])
        raise UserError(f"{path}: not a readable .npy file ({exc})") from None


PICKLE_REFUSAL = ("holds Python objects (an object array), which loading would unpickle: amp-rewrite never "
                  "unpickles a data file; save numeric arrays")


def _members(path: str | os.PathLike) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


def _refuse_objects(path: str | os.PathLike, members: list[str | None]) -> None:
    """Refuse ``path`` if one of its arrays (``members`` of an .npz; None: the .npy file itself) is of
    objects, read from its header alone."""
    for member in members:
        try:
            if member is None:
                with open(path, "rb") as stream:
                    objects = _holds_objects(stream)
            else:
                with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
                    objects = _holds_objects(stream)
        except (OSError, ValueError, zipfile.BadZipFile):
            continue
        if objects:
            raise UserError(f"{path}{f' ({member})' if member else ''} {PICKLE_REFUSAL}")


def _holds_objects(stream: IO[bytes]) -> bool:
    version = np.lib.format.read_magic(stream)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return bool(reader(stream)[2].hasobject)


def load_npz(path: str | os.PathLike, model: onnx.ModelProto) -> Sample:
    """One sample from an .npz file keyed by input name, checked against the model's inputs."""
    return checked(read_npz(path), model, str(path))


def resolve(items: Iterable, model: onnx.ModelProto) -> list[Sample]:
    """Samples from .npz paths or dicts of arrays, checked against the model's inputs."""
    return [checked(item, model) if isinstance(item, Mapping) else load_npz(item, model) for item in items]


def checked(sample: Mapping[str, np.ndarray], model: onnx.ModelProto, origin: str = "input data") -> Sample:
    """The sample cast to the model's input types; UserError on a missing, unknown or misshaped input."""
    inputs = graph_inputs(model)
    unknown = sorted(set(sample) - set(inputs))
    if unknown:
        raise UserError(f"{origin}: {', '.join(unknown)} not among the model inputs ({', '.join(inputs)})")
    missing = [n for n in inputs if n not in sample]
    if missing:
        raise UserError(f"{origin}: no data for model input(s) {', '.join(missing)}")
    result = {}
    for name, info in inputs.items():
        array = np.asarray(sample[name])
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and (
            len(dims) != array.ndim
            or any(_fixed(d) is not None and _fixed(d) != n for d, n in zip(dims, array.shape))
        ):
            raise UserError(f"{origin}: input {name!r} has shape {list(array.shape)}, the model expects "
                            f"{_shape_text(dims)}")
        result[name] = array.astype(_numpy_type(info.type.tensor_type.elem_type), copy=False)
    return result


def to_add(model: onnx.ModelProto, given: Sequence[Sample], random: int | None,
           shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> Iterable[Attempt]:
    """The generated samples to add to ``given`` ones, as candidate sets in ``attempts``' order
    (a caller takes the first its float32 run accepts): ``random`` of them, one where nothing is
    given; where samples are given and none are asked for, one empty set."""
    return attempts(model, shapes, seed, random or 1) if random or not given else [Attempt("", [])]


def generate(model: onnx.ModelProto, count: int = 1, shapes: Mapping[str, Sequence[int]] | None = None,
             seed: int = 0) -> list[Sample]:
    """``count`` generated samples for the model's inputs: the first, most plausible, of ``attempts``."""
    return next(attempts(model, shapes, seed, count)).samples


class Attempt(NamedTuple):
    """One candidate set of generated samples: what extents the names got, the samples, and
    whether it is worth a run only after one failed inside the model (``LONGER_DIMS``)."""

    description: str
    samples: list[Sample]
    longer: bool = False

    def worth_after(self, refusal: BaseException | str | None) -> bool:
        """Whether to run this set after ``refusal`` (the last set's failure; None: none yet)."""
        return not self.longer or refusal is not None and failed_inside(refusal)


def failed_inside(refusal: BaseException | str) -> bool:
    """Whether ONNX Runtime loaded the model and failed running one of its nodes: an operand's
    extent may be what it refused (a model it cannot load fails whatever the extents)."""
    return "Non-zero status code returned while running" in str(refusal)


def attempts(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0,
             count: int = 1, implied_first: bool = True, supplied: Collection[str] = ()) -> Iterator[Attempt]:
    """Candidate sets of ``count`` generated samples, the most plausible first, each with a line
    saying what extents the dimension names got (``batch=4 (from Reshape 'r1'), seq=8``; empty
    when the model names none).

    First the extents the graph implies (``input_dims.implied_dims``), NAMED_DIM or UNNAMED_DIM
    for the others (where the graph's counts were guessed, then its second guess; free names
    lowered while a sample would exceed SAMPLE_ELEMENTS); then the others at each of
    FALLBACK_DIMS; then, where the model has strided Convs or pools, the names no input leads
    with at their total stride (``input_dims.total_stride``); then, if the graph implied
    anything, the same without what it implied; last, the free names at each of LONGER_DIMS
    (``Attempt.longer``). A set of more than SET_BYTES is passed over (a UserError where every
    set is). ``implied_first=False`` puts the plain
    defaults first and infers what the graph implies only when they are rejected: for a
    caller that retries, the inference (a shape inference of the whole model) is paid only
    by the models that need it. ``shapes`` fix inputs outright and bind the names their
    dimensions have: they always win. ``supplied``: inputs the caller feeds itself (a training
    step's weights): their declared shapes bind names, but they are neither drawn nor counted in a
    set's size. Every set is drawn from ``seed``."""
    fixed_shapes = {name: tuple(dims) for name, dims in (shapes or {}).items()}
    inputs = graph_inputs(model)
    unknown = sorted(set(fixed_shapes) - set(inputs))
    if unknown:
        raise UserError(f"--shape names {', '.join(unknown)}, not among the model inputs ({', '.join(inputs)})")
    named = {name: _named_shape(info) for name, info in inputs.items()}
    defaults = {d: UNNAMED_DIM if d == input_dims.unnamed_dim(name, axis) else NAMED_DIM
                for name, dims in named.items() for axis, d in enumerate(dims) if isinstance(d, str)}
    given = {d: input_dims.Pin(extent, f"the given shape of {name!r}")
             for name, fixed in fixed_shapes.items() if len(named[name]) == len(fixed)
             for d, extent in zip(named[name], fixed) if isinstance(d, str)}

    leading = {dims[0] for dims in named.values() if dims}
    failed: list[str] = []
    structure = _without_functions(model)

    def implied_dims(guess: int) -> dict:
        try:
            return input_dims.implied_dims(structure, named, given, guess=guess)
        except Exception as exc:  # a rule's own failure: the plain extents are still worth trying
            failed.append(f"{IMPLIED_FAILED} ({type(exc).__name__}: {exc})")
            return given

    def plans() -> Iterator[tuple[dict, int | None]]:
        if not implied_first:
            yield given, None
        implied = implied_dims(1)
        yield implied, None
        if any(pin.guessed for pin in implied.values()):
            yield implied_dims(2), None
        yield from ((implied, size) for size in FALLBACK_DIMS)
        stride = input_dims.total_stride(structure)
        if stride > 1:  # the names that no input leads with, at multiples of every downsampling
            strided = {d: input_dims.Pin(stride, "the Convs' and pools' total stride") for d in defaults
                       if d not in implied and d not in leading}
            if strided:
                yield {**implied, **strided}, None
        if implied != given:
            yield from ((given, None), (given, FALLBACK_DIMS[0]))
        for size in LONGER_DIMS:  # the sequence's, the image's extents: never the batch's
            yield {**given, **{d: input_dims.Pin(size, LONGER_ORIGIN) for d in defaults
                               if d not in given and d not in leading}}, None

    dtypes = {name: _numpy_type(info.type.tensor_type.elem_type) for name, info in inputs.items()}
    # integer inputs may index, they and the scalars and vectors may steer an op (``operands``)
    index = ModelIndex(structure) if any(t.kind in "iub" or len(named[name]) <= 1 for name, t in dtypes.items()) \
        else None
    highs = integer_ranges(index) if index is not None else {}
    tried, too_large = set(), []
    for pins, size in plans():
        extents = {d: _extent(pins.get(d), size or default) for d, default in defaults.items()}
        capped = _capped(extents, [d for d in defaults if d not in pins], named, fixed_shapes) if size is None else {}
        extents.update(capped)
        spelled = _spelled_out(extents, pins)
        extents.update(spelled)
        plan = {name: fixed_shapes[name] if name in fixed_shapes else
                tuple(d if isinstance(d, int) else extents[d] for d in dims)  # every name has an extent
                for name, dims in named.items()}
        if tuple(plan.items()) in tried:
            continue
        tried.add(tuple(plan.items()))
        rng = np.random.default_rng(seed)
        said = {d: " (as its name says)" if d in spelled and d not in pins else
                f" (a sample of at most {SAMPLE_ELEMENTS} elements)" if d in capped else _origin(pins.get(d), extent)
                for d, extent in extents.items()}
        description = "; ".join(filter(None, [", ".join(f"{d}={extent}{said[d]}" for d, extent in extents.items()),
                                              *failed[:1]]))
        longer = any(pin.origin == LONGER_ORIGIN for pin in pins.values())
        if longer and sum(math.prod(shape) for shape in plan.values()) > LONGER_ELEMENTS:
            continue
        drawing = {name: shape for name, shape in plan.items() if name not in supplied}
        size_bytes = count * sum(math.prod(shape) * dtypes[name].itemsize for name, shape in drawing.items())
        if size_bytes > SET_BYTES:
            shown = description or ", ".join(f"{printable(name)} {list(shape)}" for name, shape in drawing.items())
            too_large.append(f"{size_bytes / 2**30:.3g} GiB for {shown}")
            continue
        steering = operands.operand_values(index, plan, dtypes) if index is not None else {}
        # every input drawn, so that each keeps the draws it had before steering inputs were made
        drawn = [{name: _draw(rng, name, shape, dtypes[name], highs.get(name)) for name, shape in drawing.items()}
                 for _ in range(count)]
        yield Attempt(description, [{**sample, **steering} for sample in drawn], longer)
    if len(too_large) == len(tried):
        raise UserError(f"generated inputs would exceed {SET_BYTES / 2**20:.3g} MiB a set ({too_large[0]}); "
                        f"pass --shape NAME:DIMS or --inputs")


def _capped(extents: Mapping[str, int], free: Sequence[str], named: Mapping[str, tuple],
            shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The ``free`` names' extents, halved together until one sample's inputs hold at most
    ``SAMPLE_ELEMENTS`` elements or they are 1 (only those lowered, with their new extents)."""
    def elements(scale: int) -> int:
        def extent(d: int | str) -> int:
            return d if isinstance(d, int) else max(1, extents[d] // scale) if d in free else extents[d]
        return sum(math.prod(shapes[name] if name in shapes else map(extent, dims)) for name, dims in named.items())

    scale = 1
    while elements(scale) > SAMPLE_ELEMENTS and any(extents[d] // scale > 1 for d in free):
        scale *= 2
    return {d: max(1, extents[d] // scale) for d in free if scale > 1 and extents[d] > 1}


def _without_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or where it defines functions, a copy without its large weights' bytes and with
    their calls inlined: what the dimension and operand rules read (the Reshape that binds a
    dimension may sit in a function's body)."""
    if not model.functions:
        return model
    try:
        return inlined(without_weights(model))
    except ValueError:  # the rules read what they can of the calls left whole
        return model


def _spelled_out(extents: Mapping[str, int], pins: Mapping[str, input_dims.Pin]) -> dict[str, int]:
    """The extents of the dimensions that are sums of others: where the graph says so
    (``Pin.sum_of``), or where their names spell out arithmetic on other dimensions' names, as
    exporters name a key/value cache's mask (``past_sequence_length + 1``, ``past + seq``) and
    nothing bound them; computed from the others' extents (where that is at least 1)."""
    spelled = {}
    for name in extents:
        pin = pins.get(name)
        if pin is not None and pin.sum_of:
            if all(term in extents for term in pin.sum_of):
                spelled[name] = sum(extents[term] for term in pin.sum_of)
            continue
        if pin is not None:
            continue
        try:
            tree = ast.parse(name, mode="eval").body
        except (SyntaxError, ValueError, RecursionError):  # not an expression: a name like any other
            continue
        if isinstance(tree, ast.BinOp):
            value = _arithmetic(tree, {d: e for d, e in extents.items() if d != name})
            if value is not None and 1 <= value <= MOST_SPELLED:
                spelled[name] = value
    return spelled


_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b if b else 0, ast.Div: lambda a, b: a // b if b else 0}


def _arithmetic(tree: ast.expr, extents: Mapping[str, int]) -> int | None:
    """The value of integer arithmetic (+ - * / //) on names of ``extents``; None for anything else."""
    if isinstance(tree, ast.Name):
        return extents.get(tree.id)
    if isinstance(tree, ast.Constant):
        return tree.value if type(tree.value) is int else None
    if isinstance(tree, ast.BinOp) and type(tree.op) in _OPERATORS:
        left, right = _arithmetic(tree.left, extents), _arithmetic(tree.right, extents)
        return None if left is None or right is None else _OPERATORS[type(tree.op)](left, right)
    return None


def _extent(pin: input_dims.Pin | None, default: int) -> int:
    """A name's extent: what bound it, else the default, raised to the least its readers need or
    lowered to the most they allow."""
    if pin is None or pin.sum_of:  # a sum's extent comes once its terms have theirs (``_spelled_out``)
        return default
    return max(pin.extent, default) if pin.floor else min(pin.extent, default) if pin.ceiling else pin.extent


def _origin(pin: input_dims.Pin | None, extent: int) -> str:
    """What bound a name, or what raised it to its least (``the least for Conv 'c1'``) or lowered
    it to its most."""
    if pin is None or ((pin.floor or pin.ceiling) and extent != pin.extent):
        return ""
    if pin.floor:
        return f" (the least {pin.origin.removesuffix(input_dims.AT_LEAST)})"
    return f" (the most {pin.origin.removesuffix(input_dims.AT_MOST)})" if pin.ceiling else f" (from {pin.origin})"


def first_that_runs(candidates: Iterable[Attempt], run: Callable[[list[Sample]], T]) -> tuple[str, T]:
    """``run`` on each of ``candidates`` (as ``attempts`` yields them, each where
    ``worth_after`` the last failure) until it returns: (the description of the set it ran on,
    what it returned). Raises the first set's error when none runs."""
    first = last = None
    for attempt in candidates:
        if not attempt.worth_after(last):
            continue
        try:
            return attempt.description, run(attempt.samples)
        except Exception as exc:  # the next set may run where this one did not
            first, last = first or exc, exc
    if first is None:  # every set was passed over (too large, or a longer one with no failure before it)
        raise UserError("no set of generated inputs could be tried; pass --shape NAME:DIMS or --inputs")
    raise first


def graph_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The model's real inputs (initializers listed as inputs excluded)."""
    weights = {t.name for t in model.graph.initializer}
    return {vi.name: vi for vi in model.graph.input if vi.name not in weights}


def integer_ranges(index: ModelIndex) -> dict[str, int]:
    """For integer inputs that (through shape-only ops) index a value of known shape: the extent
    of the axis they index (the least, where they index several)."""
    highs: dict[str, int] = {}
    for name in graph_inputs(index.model):
        value = index.values.get((0, name))
        frontier, seen = [value] if value else [], set()
        while frontier:
            current = frontier.pop()
            for node_id, slot in current.uses:
                node = index.nodes[node_id]
                indexing = _INDEXING.get((node.op_type, slot))
                data = node.inputs[indexing.data] if indexing and indexing.data < len(node.inputs) else None
                shape = _known_shape(index, index.values[data]) if data else None
                high = _indexed_extent(node, indexing, shape) if shape and indexing else None
                if high is not None:
                    highs[name] = min(highs.get(name, high), high)
                elif node.op_type in _PASS_THROUGH and slot == 0 and node.outputs[0] not in seen:
                    seen.add(node.outputs[0])
                    frontier.append(index.value(node.outputs[0]))
    return highs


def _known_shape(index: ModelIndex, value: Value) -> tuple | None:
    """A value's shape as declared, or as its Constant node holds it (an embedding table there)."""
    producer = index.producer_node(value)
    if value.shape is None and producer is not None and producer.op_type == "Constant" and producer.domain == "":
        tensor = constant_tensor(producer.proto)
        return None if tensor is None else tuple(tensor.dims)
    return value.shape


def _indexed_extent(node: Node, indexing: _Indexes, shape: tuple) -> int | None:
    """The extent that an indexing node's indices stay below, for data of ``shape``."""
    if indexing.axis is None:
        extents = [d for d in shape if isinstance(d, int)]
        return min(extents) if len(extents) == len(shape) and min(extents) > 0 else None
    axis = indexing.axis if isinstance(indexing.axis, int) else next(
        (a.i for a in node.proto.attribute if a.name == indexing.axis), 0)
    extent = shape[axis] if -len(shape) <= axis < len(shape) else None
    return extent if isinstance(extent, int) and extent > 0 else None


def _named_shape(info: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    """An input's dimensions: fixed extents, names, and ``input[axis]`` for unnamed ones."""
    if not info.type.HasField("tensor_type"):
        raise UserError(f"input {info.name!r} is not a tensor; pass its data with --inputs")
    return tuple(fixed if (fixed := _fixed(d)) is not None else d.dim_param or input_dims.unnamed_dim(info.name, axis)
                 for axis, d in enumerate(info.type.tensor_type.shape.dim))


def _draw(rng: np.random.Generator, name: str, shape: tuple[int, ...], dtype: np.dtype, high: int | None):
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if MASK_NAME.search(name) and dtype.kind in "biu":
        return np.ones(shape, dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, high or INTEGER_HIGH, shape).astype(dtype)
    raise UserError(f"cannot generate data for input {name!r} of type {dtype}; pass it with --inputs")


def _numpy_type(elem_type: int) -> np.dtype:
    if elem_type == TensorProto.BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise UserError(f"unsupported input element type {elem_type}") from None


def _fixed(dim) -> int | None:
    """A dimension's fixed extent; None for a name, nothing, or the -1 or 0 some exporters write
    for a dynamic dimension (ONNX Runtime runs a model with such inputs declared unknown:
    ``instrument.session``)."""
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None


def _shape_text(dims: Iterable) -> str:
    return "[" + ", ".join(str(_fixed(d)) if _fixed(d) is not None else (d.dim_param or "?")
                           for d in dims) + "]"
