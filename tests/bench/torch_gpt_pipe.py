#!/usr/bin/env python3
"""torch.distributed.pipelining training of the GPT that `troupe train --model gpt:... --pipeline
SCHEDULE --ranks P --microbatches M` trains, for tests/bench/gpt_pipe_compare.sh.

    PY tests/bench/torch_gpt_pipe.py --text ../shared/data/tinyshakespeare.txt --ranks 2 \
        --schedule 1f1b --microbatches 4 [--steps 200] [--model gpt:layers=8,...]

The model, data, AdamW groups, learning-rate schedule and clipping are torch_gpt.py's (the same
module is imported). The pipeline:
- P processes (torch.multiprocessing), one thread each, a gloo process group on 127.0.0.1;
- the model as pieces [embeddings, block 0, ..., block L-1, final norm + head], cut into
  S contiguous stages of as equal a number of blocks as possible (S = P for gpipe and 1f1b,
  2P for the others); rank r holds stage r (and r + P for interleaved-1f1b, looped-bfs and
  interleaved-zb, or 2P - 1 - r for the V schedules zb-v and dualpipe-v), as PyTorch's
  schedules expect;
- each step: a batch of `batch` windows split into M microbatches, the schedule's step, the
  gradient norm summed over every rank (an all-reduce of the squares) and clipped, AdamW.

Prints one summary line
    {"impl":"pytorch-pipelining","torch":V,"schedule":S,"ranks":P,"microbatches":M,
     "train_loss":L,"tokens_per_s":T,"seconds":S}
tokens_per_s counts training tokens (steps x batch x ctx) over the training time measured by
rank 0 between barriers (the first step, which builds the schedule's buffers, excluded).

PyTorch is not a dependency of troupe: run this with the Python of a virtual environment that
has it. Exits 2 with a message when torch cannot be imported or an argument is bad.
"""

import argparse
import json
import math
import os
import socket
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.distributed import pipelining as pp
except ImportError as e:
    print("torch_gpt_pipe.py: PyTorch is not importable (%s); run this with the Python of a virtual "
          "environment that has it (pip install torch)" % e, file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402  (the model, the data and the schedule of the one-process run)

SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "looped-bfs": ("ScheduleLoopedBFS", 2, "loop"),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zb-v": ("ScheduleZBVZeroBubble", 2, "v"),
    "dualpipe-v": ("ScheduleDualPipeV", 2, "v"),
}


class Embed(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.wte, self.wpe = gpt.wte, gpt.wpe

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))


class Final(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        return self.head(self.ln_f(x))


def stage_modules(gpt, stages):
    """The model's pieces cut into `stages` contiguous sequentials, blocks spread evenly."""
    blocks = list(gpt.blocks)
    if stages > len(blocks) + 2:
        raise ValueError("%d stages need at least %d layers" % (stages, stages - 2))
    pieces = [Embed(gpt)] + blocks + [Final(gpt)]
    base, extra = divmod(len(pieces), stages)
    out, at = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(torch.nn.Sequential(*pieces[at:at + n]))
        at += n
    return out


def stages_of(rank, ranks, per_rank, layout):
    if per_rank == 1:
        return [rank]
    if layout == "v":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(per_rank)]


def run(rank, a, port, g, vocab_size, result):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    name, per_rank, layout = SCHEDULES[a.schedule]
    n_stages = a.ranks * per_rank
    torch.manual_seed(a.seed)
    model = torch_gpt.GPT(vocab_size, g)  # every rank builds the same model, keeps its stages
    mods = stage_modules(model, n_stages)
    mine = stages_of(rank, a.ranks, per_rank, layout)
    stages = [pp.PipelineStage(mods[s], s, n_stages, torch.device("cpu")) for s in mine]
    params = [q for s in mine for q in mods[s].parameters()]
    decay = [q for q in params if q.dim() >= 2]
    plain = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": plain, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.99), eps=1e-8)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    cls = getattr(pp, name)
    sched = cls(stages[0] if per_rank == 1 else stages, n_microbatches=a.microbatches, loss_fn=loss_fn)
    first = 0 in mine
    last = n_stages - 1 in mine
    _, train, _ = torch_gpt.load_corpus(a.text)
    rng = torch.Generator().manual_seed(a.seed * 2 + 1)
    tokens_per_step = a.batch * g["ctx"]
    loss_sum, losses_n, start = 0.0, 0, None
    for step in range(1, a.steps + 1):
        if step == 2:  # the first step builds the schedule's buffers: time from the second
            dist.barrier()
            start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = torch_gpt.lr_at(step, a.lr, a.lr / 10, a.warmup, a.steps)
        x, y = torch_gpt.batch_of(train, a.batch, g["ctx"], rng)  # same draws on every rank
        opt.zero_grad(set_to_none=True)
        losses = []
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        sched.step(*args, **kwargs)
        squares = torch.zeros(1)
        for q in params:
            if q.grad is not None:
                squares += q.grad.detach().pow(2).sum()
        dist.all_reduce(squares)
        norm = math.sqrt(squares.item())
        if a.clip > 0 and norm > a.clip:
            for q in params:
                if q.grad is not None:
                    q.grad.mul_(a.clip / (norm + 1e-6))
        opt.step()
        if last and step > a.steps - 10:
            loss_sum += sum(float(v.detach()) for v in losses) / len(losses)
            losses_n += 1
    dist.barrier()
    seconds = time.perf_counter() - start if start is not None else float("nan")
    if last:
        result["train_loss"] = loss_sum / max(losses_n, 1)
    if rank == 0:
        result["tokens_per_s"] = (a.steps - 1) * tokens_per_step / seconds
        result["seconds"] = seconds
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="gpt:layers=4,heads=4,embd=128,ctx=64")
    p.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    p.add_argument("--ranks", type=torch_gpt.positive_int, default=2)
    p.add_argument("--microbatches", type=torch_gpt.positive_int, default=4)
    p.add_argument("--steps", type=torch_gpt.positive_int, default=200)
    p.add_argument("--batch", type=torch_gpt.positive_int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    try:
        g = torch_gpt.parse_spec(a.model)
        if a.steps < 2:
            raise ValueError("--steps must be at least 2 (the first step is not timed)")
        if a.batch % a.microbatches:
            raise ValueError("--batch %d is not a multiple of --microbatches %d" % (a.batch, a.microbatches))
        per_rank = SCHEDULES[a.schedule][1]
        if a.ranks * per_rank > g["layers"] + 2:
            raise ValueError("%s on %d ranks needs %d stages: the model has %d layers + 2 pieces"
                             % (a.schedule, a.ranks, a.ranks * per_rank, g["layers"]))
        vocab, train, _ = torch_gpt.load_corpus(a.text)
        if len(train) < g["ctx"] + 1:
            raise ValueError("--text %s is too short for ctx %d" % (a.text, g["ctx"]))
    except ValueError as e:
        print("torch_gpt_pipe.py: %s" % e, file=sys.stderr)
        sys.exit(2)
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(run, args=(a, free_port(), g, len(vocab), result), nprocs=a.ranks, join=True)
        out = {"impl": "pytorch-pipelining", "torch": torch.__version__, "schedule": a.schedule,
               "ranks": a.ranks, "microbatches": a.microbatches, "model": a.model, "steps": a.steps,
               "train_loss": round(result.get("train_loss", float("nan")), 4),
               "tokens_per_s": round(result["tokens_per_s"], 1), "seconds": round(result["seconds"], 3)}
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
