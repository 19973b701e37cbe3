"""Cases for the elementwise rules: unary ops, broadcasting binaries, variadics."""

import numpy as np

from tests.gradcases import Case, away_from_zero, normal, positive

X = away_from_zero(2, 3, seed=1)

CASES = [
    Case("Identity", {"x": normal(2, 3)}),
    Case("Neg", {"x": normal(2, 3)}),
    Case("Abs", {"x": X}),
    Case("Exp", {"x": normal(2, 3)}),
    Case("Log", {"x": positive(2, 3)}),
    Case("Sqrt", {"x": positive(2, 3)}),
    Case("Reciprocal", {"x": positive(2, 3)}),
    Case("Sigmoid", {"x": normal(2, 3)}),
    Case("Tanh", {"x": normal(2, 3)}),
    Case("Erf", {"x": normal(2, 3)}, eps=1e-3, rtol=1e-3),  # the reference evaluator's Erf is float32
    Case("Softplus", {"x": normal(2, 3)}),
    Case("Sin", {"x": normal(2, 3)}),
    Case("Cos", {"x": normal(2, 3)}),
    Case("Softsign", {"x": X}),
    Case("Relu", {"x": X}),
    Case("LeakyRelu", {"x": X}, {"alpha": 0.1}),
    Case("LeakyRelu", {"x": X}, {"alpha": -0.3}, id="negative-slope"),  # y > 0 no longer means x > 0
    Case("Elu", {"x": X}, {"alpha": 0.7}),
    Case("Elu", {"x": X}, {"alpha": -0.5}, id="negative-alpha"),
    Case("HardSigmoid", {"x": X * 3}, {"alpha": 0.3, "beta": 0.4}),
    Case("HardSwish", {"x": np.array([-4.0, -2.5, -1.0, 0.5, 2.0, 3.5])}),
    Case("Clip", {"x": X, "min": np.array(-0.9), "max": np.array(0.8)}, constant=("min", "max"), id="both"),
    Case("Clip", {"x": X, "min": None, "max": np.array(0.7)}, constant=("max",), id="max-only"),
    Case("Pow", {"x": positive(2, 3), "p": np.array(2.5)}, constant=("p",)),
    Case("Pow", {"x": normal(2, 3), "p": np.array([2.0, 3.0, 1.0])}, constant=("p",), id="broadcast-exponent"),
    Case("PRelu", {"x": X, "slope": np.array([0.1, 0.2, 0.3])}),
    Case("Add", {"a": normal(2, 3), "b": normal(3, seed=2)}, id="broadcast"),
    Case("Add", {"a": normal(2, 1, 4), "b": normal(3, 1, seed=2)}, id="both-broadcast"),
    Case("Sub", {"a": normal(2, 3), "b": normal(2, 1, seed=2)}, id="broadcast"),
    Case("Mul", {"a": normal(4, 1, 3), "b": normal(2, 3, seed=2)}, id="broadcast"),
    Case("Mul", {"a": normal(2, 3), "b": normal(2, 3, seed=2)}, id="same"),
    Case("Div", {"a": normal(2, 3), "b": positive(3, seed=2)}, id="broadcast"),
    Case("Max", {"a": normal(2, 3), "b": normal(3, seed=5), "c": normal(1, 3, seed=6)}, id="variadic"),
    Case("Min", {"a": normal(2, 3), "b": normal(2, 3, seed=5)}),
    Case("Sum", {"a": normal(2, 3), "b": normal(3, seed=5), "c": normal(2, 1, seed=6)}),
    Case("Mean", {"a": normal(2, 3), "b": normal(3, seed=5)}),
    Case("Where", {"c": np.array([[True, False, True], [False, False, True]]), "a": normal(2, 3),
                   "b": normal(3, seed=3)}),
    Case("Cast", {"x": normal(2, 3)}, {"to": 11}, id="to-double"),
    Case("CastLike", {"x": normal(2, 3), "like": normal(1, seed=3)}, constant=("like",)),
]
