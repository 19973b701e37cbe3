"""Cases for reductions: axes as attribute (old opsets) and as input, keepdims, every axis."""

from tests.gradcases import Case, ints, normal, positive

X = normal(2, 3, 4)

CASES = [
    Case("ReduceSum", {"x": X, "axes": ints([1])}, {"keepdims": 0}, id="axes-input"),
    Case("ReduceSum", {"x": X, "axes": ints([-1, 0])}, {"keepdims": 1}, id="negative-keepdims"),
    Case("ReduceSum", {"x": X}, {"keepdims": 0}, id="all-axes"),
    Case("ReduceSum", {"x": X}, {"axes": [2], "keepdims": 0}, opset=11, id="axes-attribute"),
    Case("ReduceMean", {"x": X}, {"axes": [1], "keepdims": 0}, id="axes-attribute"),
    Case("ReduceMean", {"x": X}, {"keepdims": 1}, id="all-axes"),
    Case("ReduceMean", {"x": X, "axes": ints([0, 2])}, {"keepdims": 0}, opset=18, id="axes-input"),
    Case("ReduceMax", {"x": X}, {"axes": [1], "keepdims": 0}),
    Case("ReduceMin", {"x": X}, {"axes": [2], "keepdims": 1}),
    Case("ReduceSumSquare", {"x": X}, {"axes": [0], "keepdims": 0}),
    Case("ReduceL1", {"x": normal(2, 3, 4, seed=4) + 0.05}, {"axes": [1], "keepdims": 0}),
    Case("ReduceL2", {"x": positive(2, 3, 4)}, {"axes": [1], "keepdims": 0}),
    Case("ReduceLogSumExp", {"x": X}, {"axes": [2], "keepdims": 0}),
]
