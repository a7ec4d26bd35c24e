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


# The padding of ours before the random crop (data/pipeline.py's PAD; He et al. 2015, section
# 4.2), repeated here because this Python has no TensorFlow to import the pipeline with.
PAD = 4
# Loader processes: the PyTorch CIFAR-10 tutorial's (pytorch.org/tutorials, "Training a
# Classifier": DataLoader(..., num_workers=2)), one per core here.
WORKERS = 2


def augmented_loader(path: str, batch_size: int, workers: int):
    """The pictures of ``path`` (an .npz of uint8 ``images`` [N, 32, 32, 3] and ``labels``) as a
    PyTorch user feeds a training loop: a ``Dataset`` that augments one picture at a time, as
    torchvision's ``RandomCrop(32, padding=4)`` and ``RandomHorizontalFlip()`` do, in a shuffling
    ``DataLoader`` with ``workers`` loader processes. The augmentation is ours (``pad-crop-flip``).
    """
    import numpy as np
    import torch
    from torch.nn import functional as F

    with np.load(path, allow_pickle=False) as arrays:
        images = torch.from_numpy(arrays["images"])
        labels = torch.from_numpy(arrays["labels"].astype(np.int64))

    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return len(labels)

        def __getitem__(self, index):
            # HWC uint8: zero-pad height and width (F.pad pads the last dimensions first).
            image = F.pad(images[index], (0, 0, PAD, PAD, PAD, PAD))
            top, left = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
            image = image[top:top + 32, left:left + 32]
            if torch.rand(()) < 0.5:
                image = image.flip(1)
            return image, labels[index]

    return torch.utils.data.DataLoader(Augmented(), batch_size=batch_size, shuffle=True,
                                       drop_last=True, num_workers=workers,
                                       persistent_workers=workers > 0)


def endless(loader):
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def main() -> int:
    parser = peer_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: torch.autocast to bfloat16 (weights stay float32)")
    parser.add_argument("--memory-format", choices=("channels_last", "contiguous"),
                        default="channels_last", help="channels_last is NHWC, as ours on a CPU")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="intra-op threads (default: every CPU, as TensorFlow uses)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--records",
                        help="train on the pictures of this .npz (uint8 images [N,32,32,3], "
                             "labels [N]) through a Dataset and DataLoader that augment as "
                             "ours does (end to end); default: fixed in-memory batches, no "
                             "augmentation (the bare step)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after the timed steps, profile this many with torch.profiler "
                             "and add each op's (and inductor kernel's) self time per step")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"DataLoader processes with --records (default {WORKERS})")
    args = parser.parse_args()
    if (args.warmup_steps < 1 or args.batch_size < 1 or args.seconds <= 0 or args.threads < 1
            or args.workers < 0):
        raise UserError("--warmup-steps, --batch-size and --threads must be 1 or more, "
                        "--workers 0 or more, --seconds above 0")
    if args.records and not os.path.isfile(args.records):
        raise UserError(f"--records: no file {args.records!r}; give an .npz of uint8 images "
                        "[N,32,32,3] and labels [N] (train_throughput.py writes one)")
    expected = expected_params(args.depth)
    print_machine_line()
    # PyTorch's CPU convolutions are oneDNN's (always built in), under the same ISA cap.
    check_precision(args.precision, onednn=True)

    import torch
    from torch.nn import functional as F

    torch.set_num_threads(args.threads)
    if args.profile_steps and args.compile:
        # Inductor's generated C++ kernels show in the profile under their names only so
        # (they fuse batch norm, ReLU and adds; without it their time is the compiled region's).
        import torch._inductor.config

        torch._inductor.config.cpp.enable_kernel_profile = True
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

    if args.records:
        batches = endless(augmented_loader(args.records, args.batch_size, args.workers))
    else:
        generator = torch.Generator().manual_seed(0)
        num_batches = 16
        images = torch.randint(0, 256, (num_batches, args.batch_size, 32, 32, 3),
                               dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, NUM_CLASSES, (num_batches, args.batch_size),
                               generator=generator)
        batches = ((images[i % num_batches], labels[i % num_batches]) for i in range(10**12))

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
        train_step(*next(batches))
        step += 1
        now = time.perf_counter()
        if step == args.warmup_steps:
            started = now
        elif started is not None:
            timed_steps, elapsed = step - args.warmup_steps, now - started
            if elapsed >= args.seconds and timed_steps >= 5:
                break
    profile = {}
    if args.profile_steps:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            for _ in range(args.profile_steps):
                train_step(*next(batches))
            profiled = time.perf_counter() - started
        # Self time: an event's own wall time on its thread, less its children's, so wrappers
        # (autograd nodes, the compiled region) do not count their ops twice; microseconds.
        profile = {"profiled_ms_per_step": round(profiled * 1000 / args.profile_steps, 2),
                   "ms_by_name": {e.key: e.self_cpu_time_total / 1000 / args.profile_steps
                                  for e in prof.key_averages() if e.self_cpu_time_total}}
    print(json.dumps({"images_per_sec": round(timed_steps * args.batch_size / elapsed, 1),
                      "depth": args.depth, "precision": args.precision, "params": params,
                      "batch_size": args.batch_size, "memory_format": args.memory_format,
                      "compile": args.compile, "threads": args.threads,
                      "input": f"DataLoader, {args.workers} workers" if args.records
                      else "in-memory", "torch": torch.__version__,
                      "timed_steps": timed_steps, "timed_seconds": round(elapsed, 2),
                      **profile}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "torch_resnet.py"))
