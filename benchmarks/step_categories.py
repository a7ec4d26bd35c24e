"""What a training step's time goes to, in categories both frameworks' profiles map onto.

``category(name)`` takes a TensorFlow op type from a ``RunMetadata`` trace (``Conv2D``,
``_MklNativeFusedBatchNormV3``, ``Cast``, ...) or a PyTorch profiler event (``aten::convolution``,
an inductor kernel ``cpp_fused_native_batch_norm_legit_functional_relu_0``, ...) and returns the
part of the step it belongs to, so ``step_profile.py`` can put our step and PyTorch's side by
side. The order of ``RULES`` matters: the first match wins (a convolution's backward pass before
its forward, a kernel that fuses batch norm with a ReLU counts as batch norm).

Standard library only: the PyTorch environment imports it too.
"""

CONV_FORWARD = "convolutions, forward"
CONV_BACKWARD = "convolutions, backward (input and filter)"
BATCH_NORM = "batch norm, forward and backward"
ELEMENTWISE = "element-wise: ReLU, add, pad, pool, scale"
CASTS = "casts and layout reorders"
UPDATE = "optimizer update and weight decay"
REST = "loss, dense layer, summaries, the rest"
CATEGORIES = (CONV_FORWARD, CONV_BACKWARD, BATCH_NORM, ELEMENTWISE, CASTS, UPDATE, REST)

# (substrings of the lower-cased name, category); the first rule with a match decides.
RULES = (
    # Named first: their names hold "sum", "mul" or "add", which the element-wise rule takes.
    (("summary", "checknumerics", "histogram", "matmul", "aten::mm", "aten::addmm", "linear",
      "softmax", "cross_entropy", "nll_loss", "xent"), REST),
    (("backpropinput", "backpropfilter", "convolution_backward", "convolutionbackward",
      "conv_backward"), CONV_BACKWARD),
    (("conv2d", "convolution", "mkldnn_conv"), CONV_FORWARD),
    (("batch_norm", "batchnorm"), BATCH_NORM),
    (("applymomentum", "applykerasmomentum", "_foreach", "optimizer.", "sgd", "l2loss",
      "assignsub", "assignadd"), UPDATE),
    (("cast", "_to_copy", "totf", "reorder", "transpose", "copy_", "contiguous"), CASTS),
    (("relu", "threshold", "add", "pad", "pool", "mul", "sub", "rescal", "div", "sum",
      "mean", "square", "rsqrt", "neg", "fill", "zeros", "ones", "select", "where"),
     ELEMENTWISE),
)


def category(name: str) -> str:
    """The category of one op type or profiler event ``name``."""
    lowered = name.lower()
    if "cpp_fused" in lowered:
        # Inductor's generated C++ kernels fuse element-wise work and batch norm, whatever
        # else their names list (a fused kernel named after the convolution's backward holds
        # the ops around it): the convolutions themselves are calls to oneDNN, named aten::.
        return BATCH_NORM if "batch_norm" in lowered else ELEMENTWISE
    for needles, kind in RULES:
        if any(needle in lowered for needle in needles):
            return kind
    return REST


def by_category(ms_by_name: dict[str, float]) -> dict[str, float]:
    """Sums milliseconds per op name into milliseconds per category (every category present)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for name, ms in ms_by_name.items():
        totals[category(name)] += ms
    return totals
