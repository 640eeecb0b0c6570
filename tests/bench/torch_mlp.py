#!/usr/bin/env python3
"""PyTorch's CPU training of the model `troupe train` trains, for tests/bench/nn_compare.sh.

    /usr/bin/python3 tests/bench/torch_mlp.py [--epochs N] [--threads N] ...

The same work as `troupe train` with its defaults (kernels/include/troupe/kernels/train.hpp):
Fashion-MNIST from Debian's gzip'd IDX files, pixels scaled to [0, 1] then normalized with mean
0.2860 and std 0.3530, an MLP 784-256-128-10 with ReLU between the linear layers (PyTorch's
default initialization), batch 64 with the last partial batch kept, a fresh shuffle every epoch,
mean softmax cross-entropy, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 1e-2;
torch.optim's default implementation for CPU tensors) with the lr decayed to zero along a half
cosine over the run, set before each step as troupe does, and the test set evaluated after
every epoch.

Prints progress to stderr and one JSON line to stdout:
    {"suite":"nn","bench":"train_mlp","impl":"pytorch",...,"samples_per_s":X,"test_accuracy":A,"seconds":S}
samples_per_s counts training samples over training time only (evaluation excluded); seconds
is the wall time of the whole run, loading and evaluation included (as `troupe train --json`).

PyTorch is not a dependency of troupe (Debian: apt-get install python3-torch, then run with
/usr/bin/python3). Exits 2 with a message when torch cannot be imported, 1 on other errors.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

try:
    import torch
except ImportError as e:
    print("torch_mlp.py: PyTorch is not importable (%s); install it for this script only "
          "(Debian: apt-get install python3-torch, then run with /usr/bin/python3)" % e, file=sys.stderr)
    sys.exit(2)

MEAN, STD = 0.2860, 0.3530  # troupe::kernels::fashion_mnist_mean / fashion_mnist_std


def read_idx(path, expect_rank):
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise RuntimeError("cannot read %s (%s); install Debian's dataset-fashion-mnist" % (path, e))
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise RuntimeError("%s is not an unsigned-byte IDX file" % path)
    rank = raw[3]
    if rank != expect_rank:
        raise RuntimeError("%s has rank %d, expected %d" % (path, rank, expect_rank))
    dims = struct.unpack(">%dI" % rank, raw[4:4 + 4 * rank])
    header = 4 + 4 * rank
    count = math.prod(dims)
    if len(raw) != header + count:
        raise RuntimeError("%s: %d bytes of data for dimensions %s" % (path, len(raw) - header, dims))
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 1)
    if images.shape[0] != labels.shape[0]:
        raise RuntimeError("%s: %d images but %d labels" % (prefix, images.shape[0], labels.shape[0]))
    x = ((images.reshape(images.shape[0], -1).to(torch.float32) / 255.0) - MEAN) / STD
    return x.contiguous(), labels.to(torch.int64)


def make_model(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
    return torch.nn.Sequential(*layers)


def evaluate(model, x, labels):
    correct = 0
    with torch.no_grad():
        for b in range(0, x.shape[0], 1000):
            logits = model(x[b:b + 1000])
            correct += int((logits.argmax(dim=1) == labels[b:b + 1000]).sum())
    return correct / x.shape[0]


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1, not %s" % text)
    return v


def main():
    parser = argparse.ArgumentParser(description="PyTorch CPU training of troupe's default MLP")
    parser.add_argument("--epochs", type=positive, default=8, help="passes over the training set (default 8)")
    parser.add_argument("--batch", type=positive, default=64, help="samples per step (default 64)")
    parser.add_argument("--threads", type=positive, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    train_x, train_y = load_split(args.data_dir, "train")
    test_x, test_y = load_split(args.data_dir, "t10k")
    model = make_model([784, 256, 128, 10])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = train_x.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    total_steps = steps_per_epoch * args.epochs
    shuffle = torch.Generator().manual_seed(args.seed)

    step = 0
    samples = 0
    training_seconds = 0.0
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n, generator=shuffle)
        t0 = time.perf_counter()
        loss_sum = 0.0
        model.train()
        for b in range(0, n, args.batch):
            rows = order[b:b + args.batch]
            x, y = train_x[rows], train_y[rows]
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            step += 1
            samples += rows.shape[0]
        epoch_seconds = time.perf_counter() - t0
        training_seconds += epoch_seconds
        model.eval()
        accuracy = evaluate(model, test_x, test_y)
        print("epoch %d/%d  loss %.4f  %.0f samples/s  test accuracy %.4f" %
              (epoch, args.epochs, loss_sum / steps_per_epoch, n / epoch_seconds, accuracy), file=sys.stderr)
    seconds = time.perf_counter() - start

    print(json.dumps({
        "suite": "nn", "bench": "train_mlp", "impl": "pytorch", "torch": torch.__version__,
        "model": "mlp:784-256-128-10", "optimizer": "adamw", "epochs": args.epochs, "batch": args.batch,
        "threads": torch.get_num_threads(),
        "samples_per_s": round(samples / training_seconds, 1),
        "test_accuracy": round(accuracy, 4),
        "seconds": round(seconds, 2),
    }, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError) as e:
        print("torch_mlp.py: %s" % e, file=sys.stderr)
        sys.exit(1)
