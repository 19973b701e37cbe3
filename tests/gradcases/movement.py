"""Cases for data movement: reshapes, transposes, concat/split, slices, gathers, expand/tile."""

from tests.gradcases import Case, ints, normal

X = normal(2, 3, 4)

CASES = [
    Case("Reshape", {"x": X, "shape": ints([4, -1])}),
    Case("Flatten", {"x": X}, {"axis": 2}),
    Case("Squeeze", {"x": normal(2, 1, 3), "axes": ints([1])}),
    Case("Unsqueeze", {"x": normal(2, 3), "axes": ints([0, 3])}),
    Case("Transpose", {"x": X}, {"perm": [2, 0, 1]}),
    Case("Transpose", {"x": X}, id="default-perm"),
    Case("Concat", {"a": normal(2, 3), "b": normal(2, 1, seed=1), "c": normal(2, 2, seed=2)}, {"axis": 1}),
    Case("Concat", {"a": normal(2, 3), "b": normal(1, 3, seed=1)}, {"axis": -2}, id="negative-axis"),
    Case("Split", {"x": normal(2, 6), "split": ints([1, 3, 2])}, {"axis": 1}, outputs=(0, 1, 2)),
    Case("Split", {"x": normal(4, 3), "split": ints([1, 3])}, {"axis": 0}, outputs=(1,), n_outputs=2,
         id="one-output-used"),
    Case("Slice", {"x": X, "starts": ints([1, 0]), "ends": ints([3, 2]), "axes": ints([2, 0])}, id="axes"),
    Case("Slice", {"x": X, "starts": ints([-2]), "ends": ints([10**9]), "axes": ints([1])},
         id="negative-start-huge-end"),
    Case("Slice", {"x": X, "starts": ints([0, 1]), "ends": ints([2, 3])}, id="default-axes"),
    Case("Slice", {"x": X, "starts": ints([3]), "ends": ints([0]), "axes": ints([2]), "steps": ints([-2])},
         id="negative-step"),
    Case("Slice", {"x": X, "starts": ints([0]), "ends": ints([4]), "axes": ints([-1]), "steps": ints([2])},
         id="step-2"),
    Case("Gather", {"table": normal(5, 3), "ids": ints([[0, 2, 2], [4, -1, 1]])}, id="embedding-repeats"),
    Case("Gather", {"x": X, "ids": ints([2, 0, 2])}, {"axis": 1}, id="axis-1"),
    Case("Gather", {"x": X, "ids": ints(3)}, {"axis": 2}, id="scalar-index"),
    Case("GatherElements", {"x": normal(3, 4), "ids": ints([[0, 1, 1], [2, 0, 0], [3, 3, 1]])}, {"axis": 1}),
    Case("GatherND", {"x": normal(3, 4, 2), "ids": ints([[0, 1], [2, -1], [0, 1]])}, id="tuples-repeats"),
    Case("GatherND", {"x": normal(3, 4), "ids": ints([[[2], [0]], [[-1], [1]]])}, id="rows"),
    Case("Expand", {"x": normal(3, 1), "shape": ints([2, 3, 4])}),
    Case("Tile", {"x": normal(2, 3), "repeats": ints([2, 3])}),
]
