"""The benchmarks' own arithmetic, which their figures in docs/performance.md rest on: the
convolution shapes and FLOPs of the peak script, and the categories a step's profile is put
into. (The benchmarks' speeds are measured, never asserted: docs/performance.md.)"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))

import peak  # noqa: E402
import step_categories  # noqa: E402


@pytest.mark.parametrize("depth, convolutions, forward_macs", [
    # ResNet-20: the stem, 6 convolutions a stage of 3 blocks, 19 in all; 40.55 M multiply-adds
    # an image forward (He et al. 2015, Table 6 gives the depth; the count is the shapes').
    (20, 19, 40_550_400),
    (8, 7, 12_238_848),
])
def test_the_peak_script_counts_every_convolution_of_the_network(depth, convolutions,
                                                                  forward_macs):
    shapes = peak.conv_shapes(depth)
    assert sum(s["count"] for s in shapes) == convolutions
    macs = sum(peak.conv_flops(s, batch=1) / 2 * s["count"] for s in shapes)
    assert macs == forward_macs
    # Only the stem skips the gradient to its input: nothing needs the picture's.
    assert [s["name"] for s in shapes if not s["backprop_input"]] == ["stem"]


@pytest.mark.parametrize("name, expected", [
    ("_MklNativeConv2DBackpropFilter", step_categories.CONV_BACKWARD),
    ("aten::convolution_backward", step_categories.CONV_BACKWARD),
    ("_MklNativeFusedConv2D", step_categories.CONV_FORWARD),
    ("aten::mkldnn_convolution", step_categories.CONV_FORWARD),
    ("_MklNativeFusedBatchNormGradV3", step_categories.BATCH_NORM),
    ("cpp_fused__native_batch_norm_legit_functional_relu_0", step_categories.BATCH_NORM),
    ("graph_0_cpp_fused__native_batch_norm_legit_functional_convolution_backward_native_batch_"
     "norm_backward_threshold_backward_15", step_categories.BATCH_NORM),
    ("graph_0_cpp_fused_add_convolution_backward_threshold_backward_3",
     step_categories.ELEMENTWISE),
    ("ResourceApplyKerasMomentum", step_categories.UPDATE),
    ("Optimizer.step#SGD.step", step_categories.UPDATE),
    ("Cast", step_categories.CASTS),
    ("ReluGrad", step_categories.ELEMENTWISE),
    ("ScalarSummary", step_categories.REST),
    ("_MklNativeMatMul", step_categories.REST),
])
def test_a_profiled_op_falls_into_its_category(name, expected):
    assert step_categories.category(name) == expected


def test_categories_sum_every_op_once():
    totals = step_categories.by_category({"Conv2D": 2.0, "Relu": 1.0, "Mystery": 0.5})
    assert set(totals) == set(step_categories.CATEGORIES)
    assert sum(totals.values()) == 3.5
