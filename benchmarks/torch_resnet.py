"""PyTorch peer for the training-throughput comparison: our ResNet in a plain PyTorch loop.

The network of ``cifar10_estimator/model/resnet.py`` (ResNet v1 for CIFAR-10, He et al. 2015,
arXiv:1512.03385) written as a ``torch.nn.Module`` with the package's training settings, trained
on synthetic images held in memory; reports the steady-state rate, the steps after a warm-up
timed for ``--seconds``. Same output as ``keras_resnet.py``: the machine first, one JSON object
with ``images_per_sec``, ``depth``, ``precision`` and ``params`` last.

It needs a Python with PyTorch, not this project's environment (TensorFlow is not used):

    python3.11 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchvenv/bin/python benchmarks/torch_resnet.py --depth 20 --seconds 20

(that exact pin takes the CPU wheel; an unpinned ``torch`` downloads GBs of CUDA packages).
"""

import json
import os
import sys
import time

# The package is not installed in the PyTorch environment; machine.py and cpu.py need only it
# and the standard library, so the checkout itself serves.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_resnet import (BN_EPSILON, BN_MOMENTUM, LEARNING_RATE,  # noqa: E402
                          MOMENTUM, NUM_CLASSES, STAGES, STEM_FILTERS, WEIGHT_DECAY,
                          blocks_per_stage, check_precision, expected_params, peer_parser)
from machine import print_machine_line  # noqa: E402

from cifar10_estimator.errors import UserError, run_cli  # noqa: E402

# TensorFlow's truncated normal keeps draws within 2 standard deviations and, so that the
# variance stays 2 / fan_in after the cut, widens the normal by 1 / 0.8796 (the standard
# deviation of a unit normal truncated to [-2, 2]); tf.keras VarianceScaling's constant.
TRUNCATED_NORMAL_STDDEV = 0.87962566103423978


def he_truncated_normal_(weight):
    """resnet.py's kernel initialisation (He et al. 2015, arXiv:1502.01852): variance 2/fan_in."""
    import torch

    fan_in = weight[0].numel()  # in_channels * 3 * 3
    std = (2.0 / fan_in) ** 0.5 / TRUNCATED_NORMAL_STDDEV
    torch.nn.init.trunc_normal_(weight, 0.0, std, -2 * std, 2 * std)


def build_resnet(depth: int, memory_format=None):
    """Our ResNet v1 as a ``torch.nn.Module``: uint8 NHWC images (0..255) in, logits out.

    ``memory_format``: the activations' layout, ``torch.channels_last`` (NHWC, the default) or
    ``torch.contiguous_format`` (NCHW).
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    memory_format = memory_format or torch.channels_last

    n = blocks_per_stage(depth)

    def conv(in_channels, out_channels, stride):
        # padding=1 on every side, also at stride 2: resnet.py pads symmetrically there too.
        layer = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        he_truncated_normal_(layer.weight)
        return layer

    def batch_norm(channels):
        # PyTorch's momentum weighs the new batch: 1 - TensorFlow's decay.
        return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=1.0 - BN_MOMENTUM)

    class Block(nn.Module):
        """Post-activation basic block with an option-A shortcut (He et al. 2015, 3.3)."""

        def __init__(self, in_channels, out_channels, stride):
            super().__init__()
            self.conv1, self.bn1 = conv(in_channels, out_channels, stride), batch_norm(out_channels)
            self.conv2, self.bn2 = conv(out_channels, out_channels, 1), batch_norm(out_channels)
            self.stride = stride
            extra = out_channels - in_channels
            # F.pad pads the last dimensions first: (W, W, H, H, C before, C after).
            self.channel_pad = (0, 0, 0, 0, extra // 2, extra - extra // 2) if extra else None

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.stride > 1:
                x = F.avg_pool2d(x, self.stride, self.stride)
            if self.channel_pad:
                x = F.pad(x, self.channel_pad)
            return F.relu(y + x)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.stem_bn = conv(3, STEM_FILTERS, 1), batch_norm(STEM_FILTERS)
            blocks, channels = [], STEM_FILTERS
            for filters, first_stride in STAGES:
                for i in range(n):
                    blocks.append(Block(channels, filters, first_stride if i == 0 else 1))
                    channels = filters
            self.blocks = nn.Sequential(*blocks)
            self.dense = nn.Linear(channels, NUM_CLASSES)
            # resnet.py's dense layer: Glorot uniform kernel, zero bias.
            nn.init.xavier_uniform_(self.dense.weight)
            nn.init.zeros_(self.dense.bias)

        def forward(self, images):
            # NHWC uint8 seen as NCHW: the permuted view is channels_last in memory already.
            x = images.permute(0, 3, 1, 2).float().contiguous(memory_format=memory_format)
            x = F.relu(self.stem_bn(self.stem(x / 128.0 - 1.0)))
            x = self.blocks(x)
            # Pooling and the dense layer in float32 under bf16 autocast too, as in ours.
            with torch.autocast("cpu", enabled=False):
                return self.dense(x.float().mean((2, 3)))

    torch.manual_seed(0)
    return ResNet().to(memory_format=memory_format)


def main() -> int:
    parser = peer_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: torch.autocast to bfloat16 (weights stay float32)")
    parser.add_argument("--memory-format", choices=("channels_last", "contiguous"),
                        default="channels_last", help="channels_last is NHWC, as ours on a CPU")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="intra-op threads (default: every CPU, as TensorFlow uses)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    if args.warmup_steps < 1 or args.batch_size < 1 or args.seconds <= 0 or args.threads < 1:
        raise UserError("--warmup-steps, --batch-size and --threads must be 1 or more, "
                        "--seconds above 0")
    expected = expected_params(args.depth)
    print_machine_line()
    # PyTorch's CPU convolutions are oneDNN's (always built in), under the same ISA cap.
    check_precision(args.precision, onednn=True)

    import torch
    from torch.nn import functional as F

    torch.set_num_threads(args.threads)
    layout = (torch.channels_last if args.memory_format == "channels_last"
              else torch.contiguous_format)
    model = build_resnet(args.depth, layout).train()
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"ResNet-{args.depth}: {params:,} trainable parameters (ours: {expected:,})",
          flush=True)
    if params != expected:
        raise SystemExit(f"the PyTorch model has drifted from ours: {params:,} trainable "
                         f"parameters, ours has {expected:,}")
    # SGD's weight_decay adds wd * w to each gradient: the gradient of our loss term
    # wd * l2_loss(w) = wd * ||w||^2 / 2, over every parameter as ours, so the update is the same.
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    forward = torch.compile(model) if args.compile else model

    generator = torch.Generator().manual_seed(0)
    num_batches = 16
    images = torch.randint(0, 256, (num_batches, args.batch_size, 32, 32, 3),
                           dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (num_batches, args.batch_size), generator=generator)

    def train_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(forward(x).float(), y)
        loss.backward()
        optimizer.step()

    step, started, elapsed, timed_steps = 0, None, 0.0, 0
    while True:
        # Eager PyTorch on a CPU runs each operation before returning, so after the optimizer
        # step the step is finished and the clock reads whole steps.
        train_step(images[step % num_batches], labels[step % num_batches])
        step += 1
        now = time.perf_counter()
        if step == args.warmup_steps:
            started = now
        elif started is not None:
            timed_steps, elapsed = step - args.warmup_steps, now - started
            if elapsed >= args.seconds and timed_steps >= 5:
                break
    print(json.dumps({"images_per_sec": round(timed_steps * args.batch_size / elapsed, 1),
                      "depth": args.depth, "precision": args.precision, "params": params,
                      "batch_size": args.batch_size, "memory_format": args.memory_format,
                      "compile": args.compile, "threads": args.threads,
                      "timed_steps": timed_steps, "timed_seconds": round(elapsed, 2)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "torch_resnet.py"))
