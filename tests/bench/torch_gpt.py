#!/usr/bin/env python3
"""PyTorch eager training of the GPT that `troupe train --model gpt:...` trains, for
tests/bench/gpt_compare.sh.

    PY tests/bench/torch_gpt.py --text ../shared/data/tinyshakespeare.txt [--steps 2000] [--threads 1] ...

The work of `troupe train --model gpt:layers=4,heads=4,embd=128,ctx=64 --text FILE` with its
defaults (kernels/include/troupe/kernels/lm.hpp), which are nanoGPT's CPU configuration:
- data: the file's Unicode code points, the vocabulary their distinct values in increasing order,
  the first 90% of the tokens train and the last 10% validate (kernels/src/lm_data.cpp);
  batches of `batch` windows of ctx + 1 tokens starting anywhere (uniform offsets), as nanoGPT's
  get_batch draws them;
- the model, layer for layer as troupe's make_gpt builds it (kernels/src/gpt.cpp): token +
  learned position embedding, pre-norm blocks x + proj(attn(qkv(ln(x)))) and
  x + fc2(gelu(fc1(ln(x)))) with biases in every linear but the head, a final layer norm and a
  head without bias, untied (troupe refuses tie=1); exact (erf) GELU; no dropout; causal attention
  by F.scaled_dot_product_attention, as nanoGPT's eager model does. PyTorch's default initialization
  of the linears is troupe's (uniform in +-1/sqrt(in)); embeddings are normal(0, 0.02);
- training: mean cross-entropy, AdamW (torch.optim's default CPU implementation) with lr 1e-3,
  betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on every parameter of two or more dimensions and
  none on biases and norms, the lr set before each step to nanoGPT's warmup (100 steps) + cosine
  down to lr / 10 at the last step, gradients clipped to a global norm of 1.0;
- evaluation every `eval_every` steps and at the last one: the mean loss over `eval_batches`
  fixed validation batches.

Prints to stdout the rows `troupe train --json` prints: one per evaluation
    {"step":S,"train_loss":L,"val_loss":V,"tokens_per_s":T}
and a summary
    {"impl":"pytorch","torch":VERSION,"threads":N,"val_loss":V,"tokens_per_s":T,"seconds":S,"peak_rss_mb":M,
     "parameters":P,"vocab":K}
tokens_per_s counts training tokens (steps x batch x ctx) over training time (sampling, forward,
backward, clipping and the optimizer step; evaluation excluded), as troupe does; seconds is the
wall time of the whole run.

PyTorch is not a dependency of troupe: run this with the Python of a virtual environment that
has it. Exits 2 with a message when torch cannot be imported or an argument is bad, 1 on other
errors.
"""

import argparse
import json
import math
import resource
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("torch_gpt.py: PyTorch is not importable (%s); run this with the Python of a virtual environment "
          "that has it (pip install torch)" % e, file=sys.stderr)
    sys.exit(2)


def parse_spec(spec):
    """layers, heads, embd, ctx of a spec in troupe's form gpt:layers=4,heads=4,embd=128,ctx=64."""
    if not spec.startswith("gpt:"):
        raise ValueError("model '%s': a GPT spec starts with gpt:" % spec)
    g = {"layers": 4, "heads": 4, "embd": 128, "ctx": 64}
    for item in filter(None, spec[4:].split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in g or not value.isdigit() or int(value) < 1:
            raise ValueError("model '%s': '%s' is not one of layers=N, heads=N, embd=N, ctx=N (N >= 1)" % (spec, item))
        g[key] = int(value)
    if g["embd"] % g["heads"]:
        raise ValueError("model '%s': embd is not a multiple of heads" % spec)
    return g


def load_corpus(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError("--text %s: cannot be read (%s)" % (path, e))
    if not raw:
        raise ValueError("--text %s is empty" % path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("--text %s is not UTF-8 text (binary?): %s" % (path, e))
    if "\0" in text:
        raise ValueError("--text %s is not UTF-8 text (binary?): a NUL byte" % path)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
    cut = len(ids) * 9 // 10
    return vocab, ids[:cut], ids[cut:]


class Block(torch.nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(embd)
        self.qkv = torch.nn.Linear(embd, 3 * embd)
        self.proj = torch.nn.Linear(embd, embd)
        self.ln2 = torch.nn.LayerNorm(embd)
        self.fc1 = torch.nn.Linear(embd, 4 * embd)
        self.fc2 = torch.nn.Linear(4 * embd, embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, g):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, g["embd"])
        self.wpe = torch.nn.Embedding(g["ctx"], g["embd"])
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.wpe.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(Block(g["embd"], g["heads"]) for _ in range(g["layers"]))
        self.ln_f = torch.nn.LayerNorm(g["embd"])
        self.head = torch.nn.Linear(g["embd"], vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def batch_of(data, batch, ctx, gen):
    at = torch.randint(len(data) - ctx, (batch,), generator=gen)
    x = torch.stack([data[i:i + ctx] for i in at])
    y = torch.stack([data[i + 1:i + 1 + ctx] for i in at])
    return x, y


def lr_at(step, lr, min_lr, warmup, decay_steps):
    """troupe's warmup_cosine_lr (nanoGPT's get_lr), step counted from 1."""
    it = step - 1
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_steps:
        return min_lr
    ratio = (it - warmup) / (decay_steps - warmup) if decay_steps > warmup else 1.0
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def positive_int(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("needs a whole number >= 1, got %s" % s)
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True, help="a UTF-8 text file (../shared/data/tinyshakespeare.txt)")
    p.add_argument("--model", default="gpt:layers=4,heads=4,embd=128,ctx=64")
    p.add_argument("--steps", type=positive_int, default=2000)
    p.add_argument("--batch", type=positive_int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--eval-every", type=positive_int, default=250)
    p.add_argument("--eval-batches", type=positive_int, default=20)
    p.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    try:
        g = parse_spec(a.model)
        if not (a.lr > 0 and math.isfinite(a.lr)) or a.warmup < 0 or a.weight_decay < 0 or a.clip < 0:
            raise ValueError("--lr must be positive; --warmup, --weight-decay and --clip must not be negative")
        vocab, train, val = load_corpus(a.text)
        for name, part in (("training part (first 90%)", train), ("validation part (last 10%)", val)):
            if len(part) < g["ctx"] + 1:
                raise ValueError("--text %s: its %s has %d characters; a window of ctx + 1 = %d needs more"
                                 % (a.text, name, len(part), g["ctx"] + 1))
    except ValueError as e:
        print("torch_gpt.py: %s" % e, file=sys.stderr)
        sys.exit(2)

    start = time.perf_counter()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = GPT(len(vocab), g)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    plain = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": plain, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.99), eps=1e-8)
    rng = torch.Generator().manual_seed(a.seed * 2 + 1)
    fixed = torch.Generator().manual_seed(a.seed * 2 + 2)
    val_batches = [batch_of(val, a.batch, g["ctx"], fixed) for _ in range(a.eval_batches)]
    min_lr = a.lr / 10
    tokens_per_step = a.batch * g["ctx"]
    training_seconds, loss_sum, losses, val_loss = 0.0, 0.0, 0, float("nan")
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        x, y = batch_of(train, a.batch, g["ctx"], rng)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.lr, min_lr, a.warmup, a.steps)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        lv = loss.item()
        training_seconds += time.perf_counter() - t0
        if not math.isfinite(lv):
            print("torch_gpt.py: training diverged at step %d" % step, file=sys.stderr)
            sys.exit(1)
        loss_sum += lv
        losses += 1
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            with torch.no_grad():
                val_loss = sum(model(vx, vy).item() for vx, vy in val_batches) / len(val_batches)
            model.train()
            row = {"step": step, "train_loss": round(loss_sum / losses, 4), "val_loss": round(val_loss, 4),
                   "tokens_per_s": round(step * tokens_per_step / training_seconds, 1)}
            print(json.dumps(row, separators=(",", ":")), flush=True)
            print("step %d/%d  train loss %.4f  val loss %.4f  %.0f tokens/s" % (
                step, a.steps, row["train_loss"], val_loss, row["tokens_per_s"]), file=sys.stderr, flush=True)
            loss_sum, losses = 0.0, 0
    summary = {"impl": "pytorch", "torch": torch.__version__, "threads": a.threads, "val_loss": round(val_loss, 4),
               "tokens_per_s": round(a.steps * tokens_per_step / training_seconds, 1),
               "seconds": round(time.perf_counter() - start, 2),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
               "parameters": sum(q.numel() for q in model.parameters()), "vocab": len(vocab)}
    print(json.dumps(summary, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
