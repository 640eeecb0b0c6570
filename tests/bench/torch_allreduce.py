"""The anchor of allreduce_bench: a float32 sum all-reduce of the same size across the same number
of processes on this host with torch.distributed.all_reduce and the gloo backend.

    python3 tests/bench/torch_allreduce.py [--processes 4] [--megabytes 100] [--repeat 5]

PyTorch comes from PyPI in a virtual environment of its own; it is never a dependency of the
project. Prints one JSON object per repetition, as allreduce_bench does.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.processes)
    n = args.megabytes * 1_000_000 // 4
    idx = torch.arange(n, dtype=torch.int64)
    base = ((idx * 7 + rank * 13) % 101).to(torch.float32)
    for _ in range(args.repeat):
        x = base.clone()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        dist.barrier()
        s = time.perf_counter() - t0
        if rank == 0:
            expect = sum(((idx[:1000] * 7 + r * 13) % 101).to(torch.float32) for r in range(args.processes))
            print(json.dumps({"impl": "torch-gloo", "processes": args.processes, "megabytes": args.megabytes,
                              "seconds": round(s, 4), "algbw_gb_s": round(n * 4 / s / 1e9, 3),
                              "correct": bool(torch.equal(x[:1000], expect))}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--megabytes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--port", type=int, default=29511)
    a = p.parse_args()
    mp.spawn(worker, args=(a,), nprocs=a.processes, join=True)
