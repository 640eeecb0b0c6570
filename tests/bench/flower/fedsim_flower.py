#!/usr/bin/env python3
"""`troupe fedsim`'s configuration on Flower's simulation engine, for tests/bench/flower/compare.sh.

    PY tests/bench/flower/fedsim_flower.py [--clients N] [--per-round K] [--rounds R]
        [--partition iid|dirichlet:A] [--eval-every E] [--seed S] [--cpus N] [--data-dir DIR]

PY is a Python that can import flwr with its simulation extra (Ray), e.g. a virtual environment
made with `python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install "flwr[simulation]"`.
Flower is not a dependency of troupe; only this comparison needs it.

The work is that of `troupe fedsim` with its defaults (federated/include/troupe/federated/
simulation.hpp): Fashion-MNIST from Debian's gzip'd IDX files, pixels scaled to [0, 1] then
normalized with mean 0.2860 and std 0.3530, an MLP 784-100-10 with a ReLU (PyTorch's default
initialization), the training set split among the clients IID (a seeded permutation cut into
near-equal pieces) or by Dirichlet(A) label proportions (troupe's algorithm: a client already
holding its share of the examples gets nothing more of the next class, and the draw is repeated
while a client is left empty), K clients sampled per round, 1 local epoch of SGD (lr 0.05, batch
10, a fresh shuffle, the last partial batch kept, mean softmax cross-entropy), FedAvg weighted by
the clients' example counts, and the test set evaluated on the server every E rounds and after
the last. The clients train with NumPy (the venv's NumPy, one BLAS thread per Ray worker), as a
Flower user without PyTorch would; Flower runs them in Ray actors, `--cpus` of them at once
(default: one per core, as troupe's default thread count).

Prints Flower's and Ray's logs on stderr and on stdout one JSON line per evaluated round,
    {"round":R,"test_accuracy":A,"test_loss":L,"seconds":S}
(S: wall time since the start; round_seconds: that round's fit time), then a summary
    {"impl":"flower","flwr":V,"final_accuracy":A,"rounds_per_s":X,"peak_rss_mb":M,...}
rounds_per_s counts rounds over the time between the start of a round's client selection and
the end of its aggregation, evaluation excluded (as troupe fedsim's). The first round also
starts the Ray actors and loads the data in each of them (troupe does both before its first
round, outside its rounds/s), so rounds_per_s_after_first leaves it out and
first_round_seconds gives it. peak_rss_mb is the largest
sum of resident memory over this process and all its descendants (the Ray GCS, raylet and
workers), sampled every 50 ms from /proc. Exits 2 with a message when flwr (or Ray) cannot be
imported or an argument is bad, 1 on other errors.
"""

import argparse
import gzip
import json
import math
import os
import struct
import sys
import threading
import time

# One BLAS thread per client process: Ray runs --cpus of them at once.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

try:
    import numpy as np
    import flwr
    from flwr.client import NumPyClient
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation
    import ray  # noqa: F401  (start_simulation needs it; fail here with a clear message)
except ImportError as e:
    print("fedsim_flower.py: Flower's simulation engine is not importable (%s); install it for this "
          "script only, e.g. python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install "
          "\"flwr[simulation]\", then run it with /tmp/flwr-venv/bin/python" % e, file=sys.stderr)
    sys.exit(2)

MEAN, STD = 0.2860, 0.3530  # troupe::fashion_mnist_mean / fashion_mnist_std
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
HIDDEN = 100
CLASSES = 10


# ---- data ------------------------------------------------------------------------------------

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
    if len(raw) != header + math.prod(dims):
        raise RuntimeError("%s: %d bytes of data for dimensions %s" % (path, len(raw) - header, dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 1)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise RuntimeError("%s: %s images for %s labels" % (prefix, images.shape, labels.shape))
    if labels.max() >= CLASSES:
        raise RuntimeError("%s: a label is outside 0..9" % prefix)
    return images.reshape(images.shape[0], 784), labels.astype(np.int64)


# Pixel value -> normalized float, as troupe's 256-entry table.
LUT = ((np.arange(256, dtype=np.float32) / np.float32(255.0)) - np.float32(MEAN)) / np.float32(STD)


def partition_iid(n, clients, seed):
    order = np.random.default_rng(seed).permutation(n)
    return np.array_split(order, clients)


def partition_dirichlet(labels, clients, alpha, seed):
    """Label skew: each class cut among the clients by Dirichlet(alpha) proportions; a client
    holding n / clients examples already gets nothing of the next class (NIID-Bench), and the
    whole draw is repeated while a client is left with no example."""
    rng = np.random.default_rng(seed)
    n = labels.shape[0]
    share = n / clients
    classes = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    for _ in range(1000):
        shards = [[] for _ in range(clients)]
        sizes = np.zeros(clients)
        for members in classes:
            members = rng.permutation(members)
            p = rng.dirichlet(np.full(clients, alpha))
            open_ = sizes < share
            if open_.any():
                p = np.where(open_, p, 0.0)
            if p.sum() <= 0:  # every open proportion underflowed: spread evenly among them
                p = open_.astype(np.float64) if open_.any() else np.ones(clients)
            cuts = np.floor(np.cumsum(p) / p.sum() * len(members)).astype(np.int64)
            cuts[-1] = len(members)
            cuts = np.maximum.accumulate(np.clip(cuts, 0, len(members)))
            begin = 0
            for c in range(clients):
                shards[c].append(members[begin:cuts[c]])
                sizes[c] += cuts[c] - begin
                begin = cuts[c]
        if sizes.min() >= 1:
            return [np.concatenate(s) for s in shards]
    raise RuntimeError("dirichlet:%g: 1000 draws in a row left a client with no example; raise alpha "
                       "or use fewer clients" % alpha)


def make_partition(spec, labels, clients, seed):
    if spec == "iid":
        return partition_iid(labels.shape[0], clients, seed)
    if spec.startswith("dirichlet:"):
        alpha = float(spec.split(":", 1)[1])
        return partition_dirichlet(labels, clients, alpha, seed)
    raise ValueError("unknown partition %r (use iid or dirichlet:A)" % spec)


# Each process (the driver and every Ray worker) loads the data and computes the partition once.
_cache = {}


def shared(args):
    key = (args.data_dir, args.partition, args.clients, args.seed)
    if key not in _cache:
        _cache.clear()
        train_x, train_y = load_split(args.data_dir, "train")
        if args.clients > train_x.shape[0]:
            raise ValueError("%d clients for %d examples" % (args.clients, train_x.shape[0]))
        shards = make_partition(args.partition, train_y, args.clients, args.seed)
        _cache[key] = (train_x, train_y, shards)
    return _cache[key]


# ---- the model: MLP 784-100-10 as flat NumPy arrays [W1, b1, W2, b2] --------------------------

def initialize(seed):
    """PyTorch's default Linear initialization: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    out = []
    for fan_in, fan_out in ((784, HIDDEN), (HIDDEN, CLASSES)):
        bound = 1.0 / math.sqrt(fan_in)
        out.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        out.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    return out


def forward(params, x):
    w1, b1, w2, b2 = params
    h = x @ w1.T + b1
    a = np.maximum(h, 0)
    return h, a, a @ w2.T + b2


def log_softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def sgd_epoch(params, x_u8, y, order, batch, lr):
    """One pass of minibatch SGD over `order`; returns the summed training loss."""
    w1, b1, w2, b2 = params
    lr = np.float32(lr)
    total = 0.0
    for s in range(0, len(order), batch):
        rows = order[s:s + batch]
        x = LUT[x_u8[rows]]
        t = y[rows]
        m = len(rows)
        h, a, logits = forward((w1, b1, w2, b2), x)
        logp = log_softmax(logits)
        total -= float(logp[np.arange(m), t].sum())
        g = np.exp(logp)
        g[np.arange(m), t] -= 1.0
        g /= np.float32(m)
        gw2 = g.T @ a
        gb2 = g.sum(axis=0)
        ga = (g @ w2) * (h > 0)
        gw1 = ga.T @ x
        gb1 = ga.sum(axis=0)
        w1 -= lr * gw1
        b1 -= lr * gb1
        w2 -= lr * gw2
        b2 -= lr * gb2
    return total


def evaluate(params, x_u8, y):
    loss = 0.0
    correct = 0
    for s in range(0, x_u8.shape[0], 1000):
        _, _, logits = forward(params, LUT[x_u8[s:s + 1000]])
        logp = log_softmax(logits)
        t = y[s:s + 1000]
        loss -= float(logp[np.arange(len(t)), t].sum())
        correct += int((logits.argmax(axis=1) == t).sum())
    return loss / x_u8.shape[0], correct / x_u8.shape[0]


# ---- Flower ----------------------------------------------------------------------------------

class Client(NumPyClient):
    def __init__(self, args, cid):
        self.args = args
        self.cid = cid

    def fit(self, parameters, config):
        x_u8, y, shards = shared(self.args)
        shard = shards[self.cid]
        params = [np.array(p, dtype=np.float32, copy=True) for p in parameters]
        rng = np.random.default_rng([self.args.seed, int(config["round"]), self.cid])
        loss = 0.0
        for _ in range(self.args.local_epochs):
            loss += sgd_epoch(params, x_u8, y, rng.permutation(shard), self.args.batch, self.args.lr)
        return params, len(shard), {"train_loss": loss / max(1, len(shard) * self.args.local_epochs)}

    def evaluate(self, parameters, config):  # federated evaluation is off (fraction_evaluate=0)
        return 0.0, 0, {}


class TimedFedAvg(FedAvg):
    """FedAvg that records the wall time of each round's fit (selection to aggregation)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.round_seconds = []
        self._t0 = None

    def configure_fit(self, server_round, parameters, client_manager):
        self._t0 = time.perf_counter()
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        out = super().aggregate_fit(server_round, results, failures)
        if failures:
            raise RuntimeError("round %d: %d client(s) failed: %s" % (server_round, len(failures), failures[0]))
        self.round_seconds.append(time.perf_counter() - self._t0)
        return out


def tree_rss_bytes(root):
    """Resident bytes of `root` and all its descendants, from /proc."""
    children = {}
    rss = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
            with open("/proc/%s/statm" % entry) as f:
                resident = int(f.read().split()[1])
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = resident * page
    total = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


class PeakSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self):
        me = os.getpid()
        while not self.done.is_set():
            self.peak = max(self.peak, tree_rss_bytes(me))
            self.done.wait(0.05)

    def stop(self):
        self.done.set()
        self.join()
        self.peak = max(self.peak, tree_rss_bytes(os.getpid()))


def positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if not v > 0:
            raise argparse.ArgumentTypeError("must be positive, not %s" % text)
        return v
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=positive(int), default=100)
    ap.add_argument("--per-round", type=positive(int), default=10)
    ap.add_argument("--rounds", type=positive(int), default=20)
    ap.add_argument("--local-epochs", type=positive(int), default=1)
    ap.add_argument("--batch", type=positive(int), default=10)
    ap.add_argument("--lr", type=positive(float), default=0.05)
    ap.add_argument("--partition", default="dirichlet:0.5", help="iid or dirichlet:A")
    ap.add_argument("--eval-every", type=positive(int), default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpus", type=positive(int), default=os.cpu_count() or 1,
                    help="Ray CPUs, one client at a time on each (default: one per core)")
    ap.add_argument("--data-dir", default=DEFAULT_DATA)
    args = ap.parse_args()
    if args.per_round > args.clients:
        ap.error("--per-round %d exceeds --clients %d" % (args.per_round, args.clients))
    if not (args.partition == "iid" or args.partition.startswith("dirichlet:")):
        ap.error("--partition must be iid or dirichlet:A, not %r" % args.partition)
    if args.partition.startswith("dirichlet:"):
        try:
            alpha = float(args.partition.split(":", 1)[1])
        except ValueError:
            alpha = float("nan")
        if not (alpha > 0 and math.isfinite(alpha)):
            ap.error("--partition dirichlet:A needs a positive alpha, e.g. dirichlet:0.5")

    start = time.perf_counter()
    sampler = PeakSampler()
    sampler.start()
    try:
        shared(args)  # fails here, before Ray starts, on missing data or a bad partition
        test_x, test_y = load_split(args.data_dir, "t10k")
        final = {}

        def evaluate_fn(server_round, parameters, config):
            if server_round == 0 or (server_round % args.eval_every != 0 and server_round != args.rounds):
                return None
            loss, acc = evaluate([np.asarray(p, dtype=np.float32) for p in parameters], test_x, test_y)
            final.update(accuracy=acc, loss=loss)
            print(json.dumps({"round": server_round, "test_accuracy": round(acc, 4), "test_loss": round(loss, 4),
                              "seconds": round(time.perf_counter() - start, 3),
                              "round_seconds": round(strategy.round_seconds[-1], 3)}), flush=True)
            return loss, {"accuracy": acc}

        strategy = TimedFedAvg(
            fraction_fit=args.per_round / args.clients,
            min_fit_clients=args.per_round,
            fraction_evaluate=0.0,
            min_evaluate_clients=0,
            min_available_clients=args.clients,
            evaluate_fn=evaluate_fn,
            on_fit_config_fn=lambda r: {"round": r},
            initial_parameters=ndarrays_to_parameters(initialize(args.seed)),
        )

        def client_fn(context):
            return Client(args, int(context.node_config["partition-id"])).to_client()

        start_simulation(
            client_fn=client_fn,
            num_clients=args.clients,
            config=ServerConfig(num_rounds=args.rounds),
            strategy=strategy,
            client_resources={"num_cpus": 1, "num_gpus": 0.0},
            ray_init_args={"num_cpus": args.cpus, "include_dashboard": False,
                           "ignore_reinit_error": True, "log_to_driver": True},
        )
        if len(strategy.round_seconds) != args.rounds or "accuracy" not in final:
            raise RuntimeError("Flower ran %d of %d rounds" % (len(strategy.round_seconds), args.rounds))
    finally:
        sampler.stop()
    fit = strategy.round_seconds
    print(json.dumps({
        "impl": "flower", "flwr": flwr.__version__, "ray": ray.__version__, "numpy": np.__version__,
        "clients": args.clients, "per_round": args.per_round, "partition": args.partition,
        "final_accuracy": round(final["accuracy"], 4), "final_loss": round(final["loss"], 4),
        "rounds_per_s": round(len(fit) / sum(fit), 3),
        "rounds_per_s_after_first": round((len(fit) - 1) / sum(fit[1:]), 3) if len(fit) > 1 else None,
        "first_round_seconds": round(fit[0], 3),
        "peak_rss_mb": round(sampler.peak / 2**20, 1), "rounds": len(fit),
        "seconds": round(time.perf_counter() - start, 2)}), flush=True)


if __name__ == "__main__":
    # Run as the module fedsim_flower, importable by the Ray workers (the client code then
    # travels by reference, and each worker keeps its copy of the data between rounds).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = here + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    import fedsim_flower
    try:
        fedsim_flower.main()
    except (RuntimeError, ValueError, OSError) as e:
        print("fedsim_flower.py: %s" % e, file=sys.stderr)
        sys.exit(1)
