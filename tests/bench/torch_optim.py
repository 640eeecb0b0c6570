#!/usr/bin/env python3
"""torch.optim's CPU step time on the workload of `troupe bench optim`, for tests/bench/optim_compare.sh.

    /usr/bin/python3 tests/bench/torch_optim.py [--params N] [--tensors N] [--steps N] [--threads N]
                                                [--only sgd|adam|adamw] [--impl foreach|single|both]

The same workload as tests/bench/optim_bench.cpp: 50 M float32 parameters in 100 equal tensors,
parameters drawn from N(0, 1) and gradients from 1e-3 * N(0, 1), and the same hyperparameters
(SGD lr 1e-3 momentum 0.9; Adam lr 1e-4 weight decay 1e-4; AdamW lr 1e-4 weight decay 1e-2).
One untimed step creates the state, then `--steps` timed steps; the median is reported, with
2 threads (torch.set_num_threads) by default.

Prints one JSON line per optimizer, in the format of `troupe bench optim --json`:
    {"suite":"optim","bench":"adamw","state":"fp32","device":"cpu-torch","metric":"seconds_per_step",
     "value":S,"bytes_per_param":B,...}
device is "cpu-torch" for torch's multi-tensor implementation (foreach=True) and
"cpu-torch-single" for the single-tensor one. bytes_per_param is what a fused step has to move
per parameter: the gradient read, the parameter and every state tensor torch keeps (measured
from the optimizer's state after the steps) read and written. torch's foreach path makes one
pass per operation, so it moves several times that.

PyTorch is not a dependency of troupe (Debian: apt-get install python3-torch, then run with
/usr/bin/python3). Exits 2 with a message when torch cannot be imported, 1 on other errors.
"""

import argparse
import json
import statistics
import sys
import time

try:
    import torch
except ImportError as e:
    print("torch_optim.py: PyTorch is not importable (%s); install it for this script only "
          "(Debian: apt-get install python3-torch, then run with /usr/bin/python3)" % e, file=sys.stderr)
    sys.exit(2)

# name -> (constructor, hyperparameters): those of tests/bench/optim_bench.cpp
BENCHES = {
    "sgd": (torch.optim.SGD, dict(lr=1e-3, momentum=0.9)),
    "adam": (torch.optim.Adam, dict(lr=1e-4, weight_decay=1e-4)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-4, weight_decay=1e-2)),
}


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1, not %s" % text)
    return v


def state_bytes(opt):
    n = 0
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v) and v.numel() > 1:  # not the 0-d step counters
                n += v.numel() * v.element_size()
    return n


def main():
    parser = argparse.ArgumentParser(description="torch.optim step time on troupe bench optim's workload")
    parser.add_argument("--params", type=positive, default=50_000_000, help="parameters in all (default 50 M)")
    parser.add_argument("--tensors", type=positive, default=100, help="equal tensors (default 100)")
    parser.add_argument("--steps", type=positive, default=7, help="timed steps per row (default 7)")
    parser.add_argument("--threads", type=positive, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--only", choices=sorted(BENCHES), help="one optimizer")
    parser.add_argument("--impl", choices=("foreach", "single", "both"), default="foreach",
                        help="multi-tensor (foreach=True, default), single-tensor, or both")
    args = parser.parse_args()
    if args.params < args.tensors:
        parser.error("--params must be at least --tensors")

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    per = args.params // args.tensors
    initial = [torch.randn(per, generator=gen) for _ in range(args.tensors)]
    grads = [torch.randn(per, generator=gen).mul_(1e-3) for _ in range(args.tensors)]
    total = per * args.tensors
    impls = ("foreach", "single") if args.impl == "both" else (args.impl,)

    for name, (cls, hp) in BENCHES.items():
        if args.only and name != args.only:
            continue
        for impl in impls:
            params = [t.clone() for t in initial]
            for p, g in zip(params, grads):
                p.grad = g
            opt = cls(params, foreach=(impl == "foreach"), **hp)
            with torch.no_grad():
                opt.step()  # creates the state
                times = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    opt.step()
                    times.append(time.perf_counter() - t0)
            if not all(bool(torch.isfinite(p).all()) for p in params):
                raise RuntimeError("%s: a parameter became non-finite" % name)
            print(json.dumps({
                "suite": "optim", "bench": name, "state": "fp32",
                "device": "cpu-torch" if impl == "foreach" else "cpu-torch-single",
                "metric": "seconds_per_step", "value": round(statistics.median(times), 5),
                "bytes_per_param": round(4 + 8 + 2 * state_bytes(opt) / total, 2),
                "torch": torch.__version__, "threads": torch.get_num_threads(), "params": total,
                "tensors": args.tensors,
            }, separators=(",", ":")), flush=True)
            del opt, params
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError) as e:
        print("torch_optim.py: %s" % e, file=sys.stderr)
        sys.exit(1)
