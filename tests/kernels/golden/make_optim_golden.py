#!/usr/bin/env python3
"""Writes the optimizer golden vectors that tests/kernels/optim_golden_test.cpp checks against.

    /usr/bin/python3 tests/kernels/golden/make_optim_golden.py [--out DIR] [--kernels native]

PyTorch is not a dependency of troupe: only this generator needs it, and its output is committed
(tests/kernels/golden/optim/, about 0.8 MB). On Debian: apt-get install python3-torch.

Each case runs torch.optim's single-tensor implementation (foreach=False) in float32 over three
parameters of 1, 1000 and 4099 elements (a lone element, a multiple of every vector width, and
a size that leaves a tail) for 5 steps. Every case starts from the same parameters and sees the
same gradients, drawn fresh for each step from a normal distribution with a fixed seed, so
those are stored once:

    inputs.bin    float32 little-endian: the initial parameters, then the gradients of step 1,
                  ..., step 5; each block is the three parameters one after the other (5100
                  floats)
    <case>.bin    float32 little-endian: the parameters after step 1, ..., step 5, same blocks
    manifest.txt  the sizes, the step count, the torch version and kernels, and one line
                  per case: `case NAME KIND key=value ...` with the hyperparameters written as
                  Python's repr of the double torch received (strtod reads them back exactly)

By default torch runs its portable kernels (ATEN_CPU_CAPABILITY=default): they give the same
bits on every x86-64 machine and round every operation on its own, as troupe's kernels do.
`--kernels native` keeps the kernels torch picks for this CPU (AVX2 or AVX-512 builds, which
fuse some multiply-adds; see tests/kernels/optim_golden_test.cpp for what that changes).

Exits 2 with a message when torch cannot be imported, 1 on other errors.
"""

import argparse
import os
import struct
import sys


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim"),
                        help="output directory (default: optim/ beside this script)")
    parser.add_argument("--kernels", choices=("default", "native"), default="default",
                        help="torch's portable kernels (default) or the ones it picks for this CPU")
    return parser.parse_args()


ARGS = parse_args()
if ARGS.kernels == "default":
    os.environ["ATEN_CPU_CAPABILITY"] = "default"  # read by torch when it first dispatches a kernel
else:
    os.environ.pop("ATEN_CPU_CAPABILITY", None)

try:
    import torch
except ImportError as e:  # torch is optional: only this script needs it
    print("make_optim_golden.py: PyTorch is not importable (%s); install it for this script "
          "only (Debian: apt-get install python3-torch, then run with /usr/bin/python3)" % e,
          file=sys.stderr)
    sys.exit(2)

SIZES = (1, 1000, 4099)
STEPS = 5
SEED = 20240607

# name, kind, hyperparameters (torch's keyword names; betas as two keys)
CASES = [
    ("sgd", "sgd", dict(lr=0.1)),
    ("sgd_momentum_dampening_wd", "sgd",
     dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov_wd", "sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001)),
    ("adam", "adam", dict(lr=1e-2)),
    ("adam_l2_amsgrad", "adam", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("adamw", "adamw", dict(lr=1e-2, weight_decay=0.01)),
    ("adamw_amsgrad", "adamw",
     dict(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05, amsgrad=True)),
]

# torch's defaults, written out so that the manifest is complete
DEFAULTS = {
    "sgd": dict(lr=0.001, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "adam": dict(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False),
    "adamw": dict(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, amsgrad=False),
}


def make_optimizer(kind, params, hp):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"], dampening=hp["dampening"],
                               weight_decay=hp["weight_decay"], nesterov=hp["nesterov"], foreach=False)
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
               weight_decay=hp["weight_decay"], amsgrad=hp["amsgrad"], foreach=False)


def block(tensors):
    """The tensors' float32 values, little-endian, one after the other."""
    out = bytearray()
    for t in tensors:
        values = t.detach().to(torch.float32).contiguous().view(-1).tolist()
        out += struct.pack("<%df" % len(values), *values)
    return bytes(out)


def cpu_capability():
    """The kernels torch dispatches to: "default" (portable) or e.g. "native:AVX2"."""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch < 2.0 says it only in its build summary
        capability = "unknown"
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage:" in line:
                capability = line.split(":", 1)[1].strip()
    if capability.upper() in ("DEFAULT", "NO AVX"):
        return "default"
    return "native:" + capability.replace(" ", "_")


def value_text(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(float(v))


def main():
    args = ARGS
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)

    gen = torch.Generator().manual_seed(SEED)
    initial = [torch.randn(n, generator=gen, dtype=torch.float32) for n in SIZES]
    grads = [[torch.randn(n, generator=gen, dtype=torch.float32) for n in SIZES] for _ in range(STEPS)]
    if any(bool((g == 0).any()) for step in grads for g in step):
        raise RuntimeError("a gradient element is exactly zero; pick another seed")

    with open(os.path.join(args.out, "inputs.bin"), "wb") as f:
        f.write(block(initial))
        for step in grads:
            f.write(block(step))

    lines = [
        "# Optimizer golden vectors: torch.optim single-tensor (foreach=False) steps in float32.",
        "# Made by tests/kernels/golden/make_optim_golden.py; read by tests/kernels/optim_golden_test.cpp.",
        "torch %s" % torch.__version__,
        "kernels %s" % cpu_capability(),
        "seed %d" % SEED,
        "sizes %s" % " ".join(str(n) for n in SIZES),
        "steps %d" % STEPS,
    ]
    for name, kind, given in CASES:
        hp = dict(DEFAULTS[kind])
        unknown = set(given) - set(hp)
        if unknown:
            raise RuntimeError("case %s: unknown hyperparameters %s" % (name, sorted(unknown)))
        hp.update(given)
        params = [t.clone().requires_grad_(True) for t in initial]
        opt = make_optimizer(kind, params, hp)
        out = bytearray()
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
            out += block(params)
        with open(os.path.join(args.out, name + ".bin"), "wb") as f:
            f.write(out)
        lines.append("case %s %s %s" % (name, kind, " ".join("%s=%s" % (k, value_text(v))
                                                              for k, v in sorted(hp.items()))))

    with open(os.path.join(args.out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if (cpu_capability() == "default") != (args.kernels == "default"):
        raise RuntimeError("asked for %s kernels but torch ran %s ones" % (args.kernels, cpu_capability()))
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print("make_optim_golden.py: wrote %d cases to %s (%d bytes)" % (len(CASES), args.out, total))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError) as e:
        print("make_optim_golden.py: %s" % e, file=sys.stderr)
        sys.exit(1)
