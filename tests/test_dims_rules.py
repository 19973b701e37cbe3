"""The dimension solver (``amp_rewrite.inputs.dims``), family by family, on tiny graphs: what
``implied_dims`` binds each input name to, and what implied it (the binding's origin names the
node whose rule found it). ``tests/test_samples.py`` covers the same rules end to end, through
the samples drawn from them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_rewrite.inputs.dims import AT_LEAST, AT_MOST, Pin, implied_dims, registry, total_stride, unnamed_dim
from tests.helpers import model

I64_END = np.iinfo(np.int64).max


def _shapes(m: onnx.ModelProto) -> dict[str, tuple[int | str, ...]]:
    """Each input's dimensions as ``samples`` gives them: an extent, a name, or the unnamed one's name."""
    return {info.name: tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or unnamed_dim(info.name, axis)
                             for axis, d in enumerate(info.type.tensor_type.shape.dim))
            for info in m.graph.input}


def _implied(m: onnx.ModelProto, given: dict[str, Pin] | None = None, guess: int = 1) -> dict[str, tuple[int, str]]:
    """``implied_dims`` over ``m``'s declared inputs: {name: (extent, origin)}."""
    return {name: (pin.extent, pin.origin) for name, pin in implied_dims(m, _shapes(m), given, guess).items()}


def _ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# the registry


def test_importing_the_package_registers_a_rule_for_every_op_the_solver_reads():
    ops = ["Reshape", "Flatten", "Conv", "MaxPool", "AveragePool", "LpPool", "Pad", "Resize", "Upsample", "Expand",
           "Concat", "MatMul", "Gemm", "Tile", "Transpose", "Slice", "Split", "Gather", "Range", "If", "Loop"]
    assert all(registry.lookup(op) is not None for op in ops)
    assert registry.lookup("Add") is registry.lookup("Where") is registry.lookup("Expand")  # broadcasting ops
    assert registry.lookup("Relu") is None


def test_a_second_rule_for_an_op_is_refused():
    with pytest.raises(ValueError, match="two dimension rules for Reshape"):
        registry.rule("Reshape")(lambda rules, node: None)


# reshape: Reshape, Flatten


def test_a_reshape_to_a_fixed_shape_binds_the_one_name_its_count_leaves():
    m = model("""(float[batch,16] x) => (float[a,b,c] y) { [r] y = Reshape(x, shape) }""",
              {"shape": _ints(1, 4, 64)})
    assert _implied(m) == {"batch": (16, "Reshape 'r'")}


def test_a_reshape_counts_back_through_a_relu_to_an_earlier_reshape():
    """The second Reshape's count is the first's input's: x[batch, seq] flattened, then [3, 4]
    with seq fixed by a MatMul beside it."""
    m = model("""(float[batch,seq] x) => (float[a,b] y, float[c,d] z) {
        [r0] f = Reshape(x, flat)
        h = Relu(f)
        [r1] y = Reshape(h, shape)
        [m] z = MatMul(x, w)
    }""", {"flat": _ints(-1), "shape": _ints(3, 4), "w": np.ones((2, 5), np.float32)})
    assert _implied(m) == {"seq": (2, "MatMul 'm'"), "batch": (6, "Reshape 'r1'")}


def test_a_name_repeated_in_a_count_is_solved_for():
    m = model("""(float[batch,batch] x) => (float[a] y) { [r] y = Reshape(x, shape) }""", {"shape": _ints(9)})
    assert _implied(m) == {"batch": (3, "Reshape 'r'")}


def test_a_flattened_product_that_meets_a_fixed_extent_is_a_count():
    """LeNet's Flatten into a Gemm: channels x height = 24 with 6 channels is height 4."""
    m = model("""(float[batch,6,height] x) => (float[a,b] y) {
        f = Flatten<axis = 1>(x)
        [fc] y = Gemm(f, w)
    }""", {"w": np.ones((24, 10), np.float32)})
    assert _implied(m) == {"height": (4, "Gemm 'fc'")}


def test_a_count_that_two_names_share_goes_to_the_last_the_others_at_the_guess():
    m = model("""(float[batch,seq] x) => (float[a] y) { [r] y = Reshape(x, shape) }""", {"shape": _ints(12)})
    assert _implied(m) == {"batch": (1, "Reshape 'r', guessed"), "seq": (12, "Reshape 'r'")}
    assert _implied(m, guess=2) == {"batch": (2, "Reshape 'r', guessed"), "seq": (6, "Reshape 'r'")}


def test_a_reshape_with_minus_one_guesses_a_multiple_last():
    """x[batch, seq] to [-1, 4]: the count need only be a multiple of 4; seq (the last name) makes
    it up, batch guessed 1."""
    m = model("""(float[batch,seq] x) => (float[a,b] y) { [r] y = Reshape(x, shape) }""", {"shape": _ints(-1, 4)})
    assert _implied(m) == {"batch": (1, "Reshape 'r', guessed"), "seq": (4, "Reshape 'r', guessed")}


# windows: Conv and the pools, Pad, Resize


def test_a_stride_two_conv_gives_a_rounded_dimension_that_a_reshape_solves():
    """(height + 2 - 3) // 2 + 1 = 5 holds for height 9 and 10: the least that the count keeps."""
    m = model("""(float[1,1,height,8] x) => (float[a] y) {
        c = Conv<strides = [2, 2], pads = [1, 1, 1, 1]>(x, w)
        [r] y = Reshape(c, shape)
    }""", {"w": np.ones((1, 1, 3, 3), np.float32), "shape": _ints(20)})
    assert _implied(m) == {"height": (9, "Reshape 'r'")}


def test_a_conv_binds_its_input_channels_to_its_weight():
    m = model("""(float[1,channels,8,8] x) => (float[a,b,c,d] y) { [c] y = Conv<group = 2>(x, w) }""",
              {"w": np.ones((4, 3, 1, 1), np.float32)})
    assert _implied(m) == {"channels": (6, "Conv 'c'")}


def test_three_pools_of_stride_two_need_fifteen():
    m = model("""(float[1,1,length] x) => (float[a,b,c] y) {
        p1 = MaxPool<kernel_shape = [3], strides = [2]>(x)
        p2 = MaxPool<kernel_shape = [3], strides = [2]>(p1)
        [p3] y = MaxPool<kernel_shape = [3], strides = [2]>(p2)
    }""")
    assert _implied(m) == {"length": (15, "for MaxPool 'p3'" + AT_LEAST)}  # the last pool's need, carried back
    assert total_stride(m) == 8


def test_a_pad_adds_to_a_dimension():
    """batch + 1, then 4 x (batch + 1) = 24."""
    m = model("""(float[batch,4] x) => (float[a] y) {
        p = Pad(x, pads)
        [r] y = Reshape(p, shape)
    }""", {"pads": _ints(1, 0, 0, 0), "shape": _ints(24)})
    assert _implied(m) == {"batch": (5, "Reshape 'r'")}


def test_a_pad_with_axes_adds_to_the_axes_it_names():
    m = model("""(float[4,seq] x) => (float[a] y) {
        p = Pad(x, pads, value, axes)
        [r] y = Reshape(p, shape)
    }""", {"pads": _ints(2, 1), "value": np.array(0, np.float32), "axes": _ints(1), "shape": _ints(40)}, opset=18)
    assert _implied(m) == {"seq": (7, "Reshape 'r'")}


def test_a_reflect_pad_needs_more_elements_than_it_reflects():
    m = model("""(float[1,seq] x) => (float[a,b] y) { [p] y = Pad<mode = "reflect">(x, pads) }""",
              {"pads": _ints(0, 2, 0, 2)})
    assert _implied(m) == {"seq": (3, "for Pad 'p'" + AT_LEAST)}


def test_a_resize_by_a_whole_scale_multiplies():
    m = model("""(float[1,1,height] x) => (float[a] y) {
        s = Resize<mode = "nearest">(x, roi, scales)
        [r] y = Reshape(s, shape)
    }""", {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2], np.float32), "shape": _ints(12)})
    assert _implied(m) == {"height": (6, "Reshape 'r'")}


# broadcast: elementwise ops, Expand, MatMul, Gemm, Concat, Tile, Transpose


def test_broadcasting_against_a_fixed_extent_binds_the_name_there():
    m = model("""(float[batch,4] x) => (float[a,b] y) { [add] y = Add(x, bias) }""",
              {"bias": np.ones((3, 4), np.float32)})
    assert _implied(m) == {"batch": (3, "Add 'add'")}


def test_broadcasting_against_one_binds_nothing():
    m = model("""(float[batch,4] x) => (float[a,b] y) { [add] y = Add(x, bias) }""",
              {"bias": np.ones((1, 4), np.float32)})
    assert _implied(m) == {}


def test_an_expand_to_a_constant_shape_binds_the_name_it_broadcasts():
    m = model("""(float[batch,1] x) => (float[a,b] y) { [e] y = Expand(x, shape) }""", {"shape": _ints(5, 3)})
    assert _implied(m) == {"batch": (5, "Expand 'e'")}


def test_matmul_and_gemm_bind_their_contracted_dimensions():
    m = model("""(float[batch,k] x, float[rows,n] z) => (float[a,b] y, float[c,d] w) {
        [mm] y = MatMul(x, w1)
        [gemm] w = Gemm<transB = 1>(z, w2)
    }""", {"w1": np.ones((5, 2), np.float32), "w2": np.ones((2, 7), np.float32)})
    assert _implied(m) == {"k": (5, "MatMul 'mm'"), "n": (7, "Gemm 'gemm'")}


def test_a_concat_on_its_axis_sums_and_off_its_axis_agrees():
    """[batch, 4] beside [2, 4] on axis 0 is batch + 2; [rows, 4] beside [rows, width] on axis 0
    makes width 4."""
    m = model("""(float[batch,4] x, float[rows,width] z) => (float[a] y, float[c,d] w) {
        c = Concat<axis = 0>(x, two)
        [r] y = Reshape(c, shape)
        [cat] w = Concat<axis = 0>(x, z)
    }""", {"two": np.ones((2, 4), np.float32), "shape": _ints(28)})
    assert _implied(m) == {"batch": (5, "Reshape 'r'"), "width": (4, "Concat 'cat'")}


def test_a_concat_of_two_names_meeting_a_fixed_extent_guesses_the_last():
    """a + b = 6 (a MatMul of 6 inputs): a at the least, b what is left."""
    m = model("""(float[1,a] x, float[1,b] z) => (float[p,q] y) {
        c = Concat<axis = 1>(x, z)
        [mm] y = MatMul(c, w)
    }""", {"w": np.ones((6, 2), np.float32)})
    assert _implied(m) == {"a": (1, "MatMul 'mm', guessed"), "b": (5, "MatMul 'mm'")}


def test_a_tile_multiplies_by_its_repeats():
    m = model("""(float[batch] x) => (float[a,b] y) {
        t = Tile(x, repeats)
        [r] y = Reshape(t, shape)
    }""", {"repeats": _ints(2), "shape": _ints(3, 4)})
    assert _implied(m) == {"batch": (6, "Reshape 'r'")}


def test_a_transpose_permutes_what_broadcasting_meets():
    """x[rows, cols] transposed is [cols, rows]: against [3, 1], cols is 3 and rows stays free."""
    m = model("""(float[rows,cols] x) => (float[a,b] y) {
        t = Transpose<perm = [1, 0]>(x)
        [add] y = Add(t, bias)
    }""", {"bias": np.ones((3, 1), np.float32)})
    assert _implied(m) == {"cols": (3, "Add 'add'")}


def test_a_name_broadcast_with_a_concatenation_through_transposes_is_its_sum():
    """Concat(cache[batch, past], x[batch, seq]) on axis 1 and mask[batch, total], both transposed,
    added: total is past + seq, whatever extents those take (a Pin of their sum, extent 0)."""
    m = model("""(float[batch,past] cache, float[batch,seq] x, float[batch,total] mask) => (float[p,q] y) {
        keys = Concat<axis = 1>(cache, x)
        swapped = Transpose<perm = [1, 0]>(keys)
        flipped = Transpose<perm = [1, 0]>(mask)
        y = Add(swapped, flipped)
    }""")
    assert implied_dims(m, _shapes(m)) == {"total": Pin(0, "the sum past + seq it is broadcast with",
                                                        sum_of=("past", "seq"))}


def test_a_name_broadcast_against_a_bound_one_takes_its_extent():
    m = model("""(float[a] x, float[b] z) => (float[p] y, float[q] w) {
        [add] y = Add(x, z)
        [r] w = Reshape(x, shape)
    }""", {"shape": _ints(4)})
    assert _implied(m) == {"a": (4, "Reshape 'r'"), "b": (4, "Add 'add'")}


def test_names_broadcast_together_are_taken_as_equal_when_guessing():
    """x[a] + z[b] reshaped to [4]: the sum's dimension is a, b or either where the other is 1,
    which nothing resolves until the guess that they are equal gives it a; then a binds b."""
    m = model("""(float[a] x, float[b] z) => (float[q] w) {
        [add] y = Add(x, z)
        [r] w = Reshape(y, shape)
    }""", {"shape": _ints(4)})
    assert _implied(m) == {"a": (4, "Reshape 'r'"), "b": (4, "Add 'add'")}


# slicing: Slice, Split, Gather, Range, shape values


def test_a_slice_from_one_to_the_end_is_the_dimension_less_one():
    m = model("""(float[batch,4] x) => (float[a] y) {
        s = Slice(x, starts, ends, axes)
        [r] y = Reshape(s, shape)
    }""", {"starts": _ints(1), "ends": _ints(I64_END), "axes": _ints(0), "shape": _ints(12)})
    assert _implied(m) == {"batch": (4, "Reshape 'r'")}


def test_a_slice_ending_at_a_shape_computed_bound():
    """x[:Shape(x)[0] - 1]: batch - 1 rows, where inference gives up on every axis."""
    m = model("""(float[batch,2] x) => (float[a] y) {
        s = Shape(x)
        b = Gather(s, zero)
        e = Sub(b, one)
        c = Slice(x, zero, e, zero)
        [r] y = Reshape(c, shape)
    }""", {"zero": _ints(0), "one": _ints(1), "shape": _ints(10)})
    assert _implied(m) == {"batch": (6, "Reshape 'r'")}


def test_a_split_into_sizes_makes_the_axis_their_sum():
    m = model("""(float[1,n] x) => (float[a,b] y, float[c,d] z) { [s] y, z = Split<axis = 1>(x, sizes) }""",
              {"sizes": _ints(2, 3)})
    assert _implied(m) == {"n": (5, "Split 's'")}


def test_a_split_into_equal_parts_guesses_a_multiple():
    m = model("""(float[1,n] x) => (float[a,b] y, float[c,d] z, float[e,f] w) {
        [s] y, z, w = Split<axis = 1>(x)
    }""", opset=13)
    assert _implied(m) == {"n": (3, "Split 's', guessed")}


def test_a_gather_of_a_constant_index_needs_the_axis_to_hold_it():
    m = model("""(float[1,seq] x) => (float[a] y) { [g] y = Gather<axis = 1>(x, index) }""",
              {"index": np.array(2, np.int64)})
    assert _implied(m) == {"seq": (3, "for Gather 'g'" + AT_LEAST)}


def test_position_ids_from_a_range_allow_at_most_the_table_rows():
    """Range(0, Shape(x)[1]) gathered from a table of 4 rows: seq 4 at most."""
    m = model("""(float[1,seq] x) => (float[a,b] y) {
        s = Shape(x)
        n = Gather(s, one)
        ids = Range(zero, n, one)
        [g] y = Gather(table, ids)
    }""", {"one": np.array(1, np.int64), "zero": np.array(0, np.int64), "table": np.ones((4, 8), np.float32)})
    assert _implied(m) == {"seq": (4, "for Gather 'g'" + AT_MOST)}


def test_a_range_over_a_shape_holds_the_dimension():
    """Range(0, Shape(x)[0], 2) holds (batch + 1) // 2 elements: 3 of them for batch 5 or 6."""
    m = model("""(float[batch] x) => (int64[a] y) {
        s = Shape(x)
        n = Gather(s, zero)
        ids = Range(zero, n, two)
        [add] y = Add(ids, three)
    }""", {"zero": np.array(0, np.int64), "two": np.array(2, np.int64), "three": np.zeros(3, np.int64)})
    assert _implied(m) == {"batch": (5, "Add 'add'")}


# control: If, Loop


def test_an_if_output_has_the_dimension_both_branches_give_it():
    """A Pad of one row in one branch, a Concat of one row in the other: both batch + 1."""
    m = model("""(float[batch,4] x, bool cond) => (float[a] y) {
        i = If(cond) <then_branch = g1 () => (float[p,q] t) { t = Pad(x, pads) },
                      else_branch = g2 () => (float[p,q] e) { e = Concat<axis = 0>(x, row) }>
        [r] y = Reshape(i, shape)
    }""", {"pads": _ints(0, 0, 1, 0), "row": np.ones((1, 4), np.float32), "shape": _ints(20)})
    assert _implied(m) == {"batch": (4, "Reshape 'r'")}


def test_a_loop_of_a_constant_trip_count_stacks_that_many_scan_outputs():
    """Three iterations of x[batch]: [3, batch], 12 elements, is batch 4."""
    m = model("""(float[batch] x) => (float[a] y) {
        s = Loop(trips, go) <body = body (int64 i, bool c) => (bool c_out, float[n] out) {
            c_out = Identity(c)
            out = Identity(x)
        }>
        [r] y = Reshape(s, shape)
    }""", {"trips": np.array(3, np.int64), "go": np.array(True), "shape": _ints(12)})
    assert _implied(m) == {"batch": (4, "Reshape 'r'")}


def test_a_loop_carried_value_keeps_its_initial_shape():
    """The body's carried input, which inference names afresh, is x's [batch, 4] throughout."""
    m = model("""(float[batch,4] x, int64 trips, bool go) => (float[a] y) {
        l = Loop(trips, go, x) <body = body (int64 i, bool c, float[p,q] s) => (bool c_out, float[p,q] s_out) {
            c_out = Identity(c)
            s_out = Relu(s)
        }>
        [r] y = Reshape(l, shape)
    }""", {"shape": _ints(8)})
    assert _implied(m) == {"batch": (2, "Reshape 'r'")}


# the driver


def test_a_given_extent_wins_over_what_the_graph_implies():
    m = model("""(float[batch,16] x) => (float[a,b,c] y) { [r] y = Reshape(x, shape) }""",
              {"shape": _ints(1, 4, 64)})
    given = {"batch": Pin(2, "the given shape of 'x'")}
    assert _implied(m, given) == {"batch": (2, "the given shape of 'x'")}


def test_a_declared_shape_binds_a_name_that_inference_carries():
    m = model("""(float[batch,16] x) => (float[3,16] y) { y = Relu(x) }""")
    assert _implied(m) == {"batch": (3, "the declared shape of 'y'")}
