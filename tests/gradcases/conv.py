"""Cases for convolutions, pools, Pad, Resize and LRN.

Limits of the reference evaluator (which computes the finite differences and runs every
gradient graph; ``tests/reference_ops`` corrects its LRN) shape some cases:
- its MaxPool returns no ``Indices`` when every stride and dilation is 1, so MaxPool cases
  have a stride or dilation above 1 on some axis (the rule adds an Indices output);
- its pools in ceil_mode place the windows wrongly when the last window overhangs the pads
  by two or more positions, so ceil_mode cases overhang by one;
- its grouped ConvTranspose is right only with one input and one output channel per group
  and no bias: grouped cases here are depthwise (Conv's input gradient is a grouped
  ConvTranspose), and ConvTranspose's output_shape fails in it;
- it cannot crop (negative Pad pads, ``np.pad``), and Resize's ``scales`` must be float32
  while the harness makes every float input float64: those, groups of several channels and
  output_shape are checked on ONNX Runtime in ``tests/test_gradients_dynamic.py``.
"""

import numpy as np

from tests.gradcases import Case, ints, normal, rng


def distinct(*shape: int, seed: int = 0) -> np.ndarray:
    """Values at least 0.1 apart, so no max is ever a tie."""
    values = rng(seed).permutation(int(np.prod(shape))) * 0.1 + rng(seed + 1).uniform(0, 0.02, int(np.prod(shape)))
    return (values - values.mean()).reshape(shape).astype(np.float64)


def conv(x, w, bias=True, id="", **attrs) -> Case:
    inputs = {"x": normal(*x), "w": normal(*w, seed=1, scale=0.5)}
    if bias:
        inputs["b"] = normal(w[0], seed=2)
    return Case("Conv", inputs, attrs, id=id)


def conv_transpose(x, w, group=1, id="", **attrs) -> Case:
    inputs = {"x": normal(*x), "w": normal(*w, seed=1, scale=0.5), "b": normal(w[1] * group, seed=2)}
    return Case("ConvTranspose", inputs, dict(attrs, group=group) if group > 1 else attrs, id=id)


def pool(op, x, id="", opset=17, **attrs) -> Case:
    return Case(op, {"x": distinct(*x) if op == "MaxPool" else normal(*x)}, attrs, opset=opset, id=id)


def resize(x, sizes, id="", roi=None, opset=17, **attrs) -> Case:
    inputs = {"x": normal(*x), "roi": roi, "scales": None, "sizes": ints(sizes)}
    return Case("Resize", inputs, attrs, opset=opset, constant=("roi",), id=id)


CASES = [
    # -- Conv: 1-D, 2-D, 3-D; strides, asymmetric pads, dilations, groups, depthwise, auto_pad
    conv((2, 3, 7), (4, 3, 3), strides=[2], pads=[1, 2], id="1d-stride-asymmetric-pads"),
    conv((1, 2, 5, 5), (3, 2, 3, 3), pads=[1, 1, 1, 1], id="2d-pads"),
    conv((1, 2, 6, 5), (2, 2, 3, 2), strides=[2, 3], pads=[0, 1, 1, 0], id="2d-strides-remainder"),
    conv((1, 2, 7, 6), (2, 2, 2, 3), dilations=[2, 1], strides=[1, 2], id="2d-dilations"),
    conv((2, 3, 5, 5), (3, 1, 3, 3), group=3, strides=[2, 2], pads=[1, 1, 1, 1], id="groups"),
    conv((1, 3, 5, 6), (3, 1, 3, 3), group=3, pads=[1, 0, 1, 2], id="depthwise"),
    conv((1, 2, 6, 6), (2, 1, 2, 3), group=2, dilations=[2, 1], strides=[1, 2], pads=[1, 1, 0, 0],
         id="groups-dilations-strides"),
    conv((1, 2, 6, 7), (2, 2, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2], id="same-upper"),
    conv((1, 2, 5, 6), (2, 2, 2, 3), auto_pad="SAME_LOWER", strides=[1, 2], id="same-lower"),
    conv((1, 2, 5, 5), (2, 2, 3, 2), auto_pad="VALID", strides=[2, 2], id="valid"),
    conv((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), strides=[2, 1, 1], pads=[1, 0, 0, 0, 1, 1], id="3d"),
    conv((2, 2, 4, 4), (3, 2, 3, 3), bias=False, id="no-bias"),
    # -- ConvTranspose: strides, pads, output_padding, dilations, groups, 1-D, auto_pad/output_shape
    conv_transpose((1, 2, 3, 3), (2, 3, 3, 3), id="2d"),
    conv_transpose((1, 2, 3, 4), (2, 2, 3, 3), strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 1],
                   id="strides-pads-output-padding"),
    conv_transpose((1, 2, 3, 3), (2, 2, 2, 2), dilations=[2, 2], strides=[1, 2], id="dilations"),
    Case("ConvTranspose", {"x": normal(2, 3, 3, 3), "w": normal(3, 1, 2, 2, seed=1)},
         {"group": 3, "strides": [2, 2], "pads": [0, 1, 0, 1]}, id="groups"),
    conv_transpose((2, 3, 4), (3, 2, 3), strides=[3], pads=[1, 1], output_padding=[2], id="1d"),
    conv_transpose((1, 2, 3, 3), (2, 2, 3, 3), strides=[2, 2], auto_pad="SAME_UPPER", id="same-upper"),
    # -- MaxPool: kernel, strides, pads, dilations, ceil_mode, 1-D, 3-D, an Indices output already there
    pool("MaxPool", (1, 2, 4, 4), kernel_shape=[2, 2], strides=[2, 2], id="k2-s2"),
    pool("MaxPool", (2, 2, 5, 5), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], id="k3-s2-pads"),
    pool("MaxPool", (1, 1, 6, 6), kernel_shape=[2, 2], dilations=[2, 2], id="dilations"),
    pool("MaxPool", (1, 2, 5, 6), kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 0, 1], id="asymmetric-pads"),
    pool("MaxPool", (1, 2, 5, 5), kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, id="ceil-mode"),
    pool("MaxPool", (2, 3, 8), kernel_shape=[3], strides=[2], pads=[1, 1], id="1d"),
    pool("MaxPool", (1, 1, 4, 4, 4), kernel_shape=[2, 2, 2], strides=[2, 2, 2], id="3d"),
    pool("MaxPool", (1, 2, 6, 6), kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER", id="same-upper"),
    Case("MaxPool", {"x": distinct(1, 2, 4, 5)}, {"kernel_shape": [2, 2], "strides": [2, 2]}, n_outputs=2,
         id="indices-output"),
    # -- AveragePool: count_include_pad 0 and 1, pads, strides, ceil_mode, auto_pad, dilations
    pool("AveragePool", (1, 2, 4, 4), kernel_shape=[3, 3], pads=[1, 1, 1, 1], id="pads-exclude"),
    pool("AveragePool", (1, 2, 4, 4), kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1,
         id="pads-include"),
    pool("AveragePool", (2, 2, 5, 6), kernel_shape=[2, 3], strides=[2, 2], id="strides"),
    pool("AveragePool", (1, 2, 5, 5), kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0], id="asymmetric-pads"),
    pool("AveragePool", (1, 2, 5, 5), kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, id="ceil-mode"),
    pool("AveragePool", (1, 1, 6, 6), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
         id="ceil-mode-pads-exclude"),
    pool("AveragePool", (1, 1, 6, 6), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
         count_include_pad=1, id="ceil-mode-pads-include"),
    pool("AveragePool", (1, 2, 5, 6), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER",
         id="same-upper-exclude"),
    pool("AveragePool", (1, 2, 5, 6), kernel_shape=[2, 3], auto_pad="SAME_LOWER", count_include_pad=1,
         id="same-lower-include"),
    pool("AveragePool", (2, 3, 7), kernel_shape=[3], strides=[2], pads=[1, 0], id="1d"),
    pool("AveragePool", (1, 2, 7, 6), kernel_shape=[2, 2], dilations=[2, 1], pads=[1, 1, 0, 1], opset=19,
         id="dilations"),
    # -- global pools
    Case("GlobalAveragePool", {"x": normal(2, 3, 3, 4)}),
    Case("GlobalAveragePool", {"x": normal(2, 3, 5)}, id="1d"),
    Case("GlobalMaxPool", {"x": distinct(2, 3, 3, 4)}),
    # -- LRN
    Case("LRN", {"x": normal(2, 5, 2, 2)}, {"size": 3, "alpha": 0.2, "beta": 0.75, "bias": 1.5}, id="size3"),
    Case("LRN", {"x": normal(1, 6, 2, 1)}, {"size": 5}, id="size5-defaults"),
    Case("LRN", {"x": normal(3, 4, 1, 2)}, {"size": 2, "alpha": 0.5, "beta": 0.6, "bias": 2.0}, id="even-size",
         ort=False),  # ONNX Runtime's LRN takes odd sizes only
    # -- Pad: constant (with its constant_value differentiated), reflect, edge, wrap, axes
    Case("Pad", {"x": normal(2, 3), "pads": ints([1, 0, 2, 1]), "value": np.array(0.5)}, id="constant"),
    Case("Pad", {"x": normal(2, 3), "pads": ints([0, 2, 1, 0])}, id="constant-no-value"),
    Case("Pad", {"x": normal(2, 3, 4), "pads": ints([1, 2, 0, 1]), "value": np.array(-1.0), "axes": ints([0, -1])},
         opset=18, id="constant-axes"),
    Case("Pad", {"x": normal(3, 4), "pads": ints([2, 1, 1, 3])}, {"mode": "reflect"}, id="reflect"),
    Case("Pad", {"x": normal(2, 3, 4), "pads": ints([0, 1, 2, 0, 2, 1])}, {"mode": "edge"}, id="edge"),
    Case("Pad", {"x": normal(2, 4, 3), "pads": ints([2, 1, 1, 2]), "value": None, "axes": ints([1, 2])},
         {"mode": "reflect"}, opset=18, id="reflect-axes"),
    Case("Pad", {"x": normal(3, 4), "pads": ints([1, 2, 3, 3])}, {"mode": "wrap"}, opset=19, id="wrap"),
    # -- Resize (4-D NCHW, spatial axes; sizes, since the harness's float inputs are float64)
    resize((1, 2, 3, 2), [1, 2, 6, 6], mode="nearest", coordinate_transformation_mode="asymmetric",
           nearest_mode="floor", id="nearest-asymmetric-floor"),
    resize((1, 2, 4, 5), [1, 2, 2, 3], mode="nearest", id="nearest-half-pixel-down"),
    resize((1, 2, 3, 3), [1, 2, 5, 7], mode="nearest", coordinate_transformation_mode="align_corners",
           nearest_mode="round_prefer_ceil", id="nearest-align-corners-ceil"),
    resize((1, 2, 3, 3), [1, 2, 6, 5], mode="linear", id="linear-half-pixel-up"),
    resize((1, 2, 3, 3), [1, 2, 5, 4], mode="linear", coordinate_transformation_mode="align_corners",
           id="linear-align-corners"),
    resize((2, 1, 5, 4), [2, 1, 3, 1], mode="linear", coordinate_transformation_mode="pytorch_half_pixel",
           id="linear-pytorch-half-pixel-down"),
    resize((1, 2, 3, 4), [1, 2, 7, 6], mode="linear", coordinate_transformation_mode="asymmetric",
           id="linear-asymmetric"),
    resize((1, 1, 4, 4), [1, 1, 3, 5], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
           roi=np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 1.3]), extrapolation_value=0.5, id="linear-tf-crop-and-resize"),
    resize((1, 2, 4, 3), [1, 2, 6, 6], mode="cubic", id="cubic-half-pixel"),
    resize((1, 2, 4, 4), [1, 2, 3, 6], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5,
           id="cubic-exclude-outside"),
    resize((1, 2, 3, 4), [5, 6], axes=[2, 3], mode="linear", opset=18, id="linear-axes"),
    resize((1, 2, 6, 6), [3, 4], axes=[2, 3], mode="linear", antialias=1, opset=18, id="linear-antialias-down"),
    resize((1, 2, 3, 4), [6, 6], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy="not_larger", opset=18,
           id="nearest-not-larger"),
    resize((1, 2, 4, 3), [1, 2, 7, 5], mode="linear", coordinate_transformation_mode="half_pixel_symmetric", opset=19,
           id="linear-half-pixel-symmetric"),
]
