"""Cases for MatMul (batch broadcasting, 1-D operands) and Gemm (every transA/transB, alpha, beta, C)."""

from tests.gradcases import Case, normal

CASES = [
    Case("MatMul", {"a": normal(3, 4), "b": normal(4, 2, seed=1)}, id="2d"),
    Case("MatMul", {"a": normal(2, 3, 4), "b": normal(4, 5, seed=1)}, id="batch-a"),
    Case("MatMul", {"a": normal(3, 4), "b": normal(2, 4, 5, seed=1)}, id="batch-b"),
    Case("MatMul", {"a": normal(2, 1, 3, 4), "b": normal(3, 4, 2, seed=1)}, id="batch-broadcast"),
    Case("MatMul", {"a": normal(4), "b": normal(2, 4, 3, seed=1)}, id="vector-a"),
    Case("MatMul", {"a": normal(2, 3, 4), "b": normal(4, seed=1)}, id="vector-b"),
    Case("MatMul", {"a": normal(4), "b": normal(4, seed=1)}, id="dot"),
] + [
    Case("Gemm", {"a": normal(*((4, 3) if ta else (3, 4))), "b": normal(*((2, 4) if tb else (4, 2)), seed=1),
                  "c": normal(*c_shape, seed=2)},
         {"transA": ta, "transB": tb, "alpha": 0.7, "beta": 1.3}, id=f"tA{ta}-tB{tb}-C{'x'.join(map(str, c_shape))}")
    for ta in (0, 1) for tb in (0, 1) for c_shape in ((3, 2), (2,), (3, 1))
] + [
    Case("Gemm", {"a": normal(3, 4), "b": normal(4, 2, seed=1), "c": None}, id="no-C"),
]
