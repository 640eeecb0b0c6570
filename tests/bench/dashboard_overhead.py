#!/usr/bin/env python3
"""What an open dashboard costs what it watches, measured so that a loaded machine does not decide it.

    tests/bench/dashboard_overhead.py PATH/TO/troupe [--repeat 11] [--rounds 20] [--only WORKLOAD]
                                      [--suites fedsim,actors] [--seed 1] [--json FILE]

The figure is CPU time (user + system, from wait4's rusage of each process), not wall time: CPU
time counts the work done, which other processes on the machine change little, while wall time on
a shared machine moves by tens of percent between two identical runs. Runs with and without the
dashboard are interleaved in pairs (the order within each pair drawn from --seed), many times, and
the report gives medians and the median of the paired ratios, with the spread of those ratios.

  fedsim  `troupe fedsim --rounds R --json` (the default run) with `--dashboard 0` against the
          same run without. The dashboard lives in the run's process, so its CPU time holds all
          the dashboard costs (the publishing of every round, the HTTP server, the JSON).
  actors  `troupe bench actors --json` (the whole suite, about 15 s; or one --only workload)
          beside a head node (`node start --head --threads 1`) with `--dashboard 0` against the
          same pair without; the figure is the CPU time of both processes together (the bench's
          fixed work plus the head, which with the dashboard asks itself for the cluster's status
          every second and serves the page).

While the dashboard is on, a client does what an open page does: it follows /events and asks
for /api/state and /metrics every 100 ms on one kept-alive connection (in this script's process,
whose CPU time is not counted: it is the browser's). The watched process's wall time is printed
beside, for reference only.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse


def fail(why):
    print("dashboard_overhead: " + why, file=sys.stderr)
    sys.exit(1)


class Page(threading.Thread):
    """An open dashboard page: the event stream, and /api/state and /metrics every 100 ms."""

    def __init__(self, url, token):
        super().__init__(daemon=True)
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.headers = {"Authorization": "Bearer " + token} if token else {}
        self.stop = threading.Event()
        self.requests = 0
        self.events_bytes = 0
        self.stream = threading.Thread(target=self._follow_events, daemon=True)

    def _follow_events(self):
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
            conn.request("GET", "/events", headers=self.headers)
            r = conn.getresponse()
            while not self.stop.is_set():
                chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
                if not chunk:
                    break
                self.events_bytes += len(chunk)
        except (OSError, http.client.HTTPException):
            pass

    def run(self):
        self.stream.start()
        conn = None
        while not self.stop.is_set():
            try:
                conn = conn or http.client.HTTPConnection(self.host, self.port, timeout=5)
                for path in ("/api/state", "/metrics"):
                    conn.request("GET", path, headers=self.headers)
                    conn.getresponse().read()
                    self.requests += 1
            except (OSError, http.client.HTTPException):
                conn = None
            self.stop.wait(0.1)


def wait_cpu(proc):
    """Waits for `proc` and returns its CPU seconds (user + system, its threads included)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def dashboard_url(err_file, proc, seconds=60):
    end = time.time() + seconds
    while time.time() < end:
        with open(err_file) as f:
            m = re.search(r"^dashboard: (http://[^ /]+)/", f.read(), re.M)
        if m:
            return m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    fail(f"no dashboard line from {' '.join(proc.args)}: {open(err_file).read()[-2000:]}")


def fedsim_run(args, work, with_dashboard):
    out, err = os.path.join(work, "fedsim.out"), os.path.join(work, "fedsim.err")
    cmd = [args.troupe, "fedsim", "--rounds", str(args.rounds), "--json"] + (["--dashboard", "0"] if with_dashboard else [])
    env = dict(os.environ, TROUPE_LOG_LEVEL="warn", TROUPE_DASHBOARD_TOKEN="")
    t0 = time.monotonic()
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=env)
    page = None
    if with_dashboard:
        page = Page(dashboard_url(err, proc), "")
        page.start()
    cpu = wait_cpu(proc)
    wall = time.monotonic() - t0
    if page:
        page.stop.set()
    if proc.returncode != 0:
        fail(f"{' '.join(cmd)} failed: {open(err).read()[-2000:]}")
    last = open(out).read().strip().splitlines()[-1]
    return {"cpu_s": cpu, "wall_s": wall, "rounds_per_s": json.loads(last)["rounds_per_s"],
            "page_requests": page.requests if page else 0}


def actors_run(args, work, with_dashboard):
    token = "overhead-token"
    env = dict(os.environ, TROUPE_LOG_LEVEL="warn", TROUPE_CLUSTER_TOKEN=token)
    head_out, head_err = os.path.join(work, "head.out"), os.path.join(work, "head.err")
    cmd = [args.troupe, "node", "start", "--head", "--host", "127.0.0.1", "--port", "0", "--threads", "1"]
    cmd += ["--dashboard", "0"] if with_dashboard else []
    with open(head_out, "w") as o, open(head_err, "w") as e:
        head = subprocess.Popen(cmd, stdout=o, stderr=e, env=env)
    end = time.time() + 30
    while '"port"' not in open(head_out).read():
        if head.poll() is not None or time.time() > end:
            fail(f"the head did not start: {open(head_err).read()[-2000:]}")
        time.sleep(0.05)
    page = None
    if with_dashboard:
        page = Page(dashboard_url(head_err, head), token)
        page.start()
    bench_out, bench_err = os.path.join(work, "bench.out"), os.path.join(work, "bench.err")
    only = ["--only", args.only] if args.only else []
    t0 = time.monotonic()
    with open(bench_out, "w") as o, open(bench_err, "w") as e:
        bench = subprocess.Popen([args.troupe, "bench", "actors", "--json"] + only, stdout=o, stderr=e, env=env)
    bench_cpu = wait_cpu(bench)
    wall = time.monotonic() - t0
    if page:
        page.stop.set()
    head.send_signal(signal.SIGTERM)
    head_cpu = wait_cpu(head)
    if bench.returncode != 0:
        fail(f"troupe bench actors {' '.join(only)} failed: {open(bench_err).read()[-2000:]}")
    return {"cpu_s": bench_cpu + head_cpu, "bench_cpu_s": bench_cpu, "head_cpu_s": head_cpu, "wall_s": wall,
            "rows": [json.loads(line) for line in open(bench_out).read().split("\n") if line.strip()],
            "page_requests": page.requests if page else 0}


def spread(values):
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"min": min(values), "q1": q[0], "median": statistics.median(values), "q3": q[2], "max": max(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("troupe")
    p.add_argument("--repeat", type=int, default=11, help="pairs of runs per suite (default 11)")
    p.add_argument("--rounds", type=int, default=20, help="fedsim rounds per run (default 20)")
    p.add_argument("--only", default="", help="one workload of the actor bench (default: the whole suite)")
    p.add_argument("--suites", default="fedsim,actors")
    p.add_argument("--seed", type=int, default=1, help="draws the order within each pair")
    p.add_argument("--json", help="also write the runs and the summary here")
    args = p.parse_args()
    args.troupe = os.path.realpath(args.troupe)
    if args.repeat < 3:
        fail("--repeat must be at least 3 (medians of fewer say little)")
    suites = {"fedsim": fedsim_run, "actors": actors_run}
    chosen = [s for s in args.suites.split(",") if s]
    for s in chosen:
        if s not in suites:
            fail(f"unknown suite {s!r}: the suites are fedsim and actors")
    rng = random.Random(args.seed)
    report = {"machine_cores": os.cpu_count(), "repeat": args.repeat, "suites": {}}
    with tempfile.TemporaryDirectory() as work:
        for suite in chosen:
            runs = []
            for i in range(args.repeat):
                pair = {}
                order = [False, True]
                rng.shuffle(order)
                for with_dashboard in order:
                    load = os.getloadavg()[0]
                    r = suites[suite](args, work, with_dashboard)
                    r["load"] = load
                    pair["with" if with_dashboard else "without"] = r
                    print(f"{suite} pair {i + 1} {'with' if with_dashboard else 'without':7}: cpu {r['cpu_s']:.3f} s, "
                          f"wall {r['wall_s']:.2f} s, load {load:.1f}", flush=True)
                runs.append(pair)
            cpu_with = [r["with"]["cpu_s"] for r in runs]
            cpu_without = [r["without"]["cpu_s"] for r in runs]
            ratios = [r["with"]["cpu_s"] / r["without"]["cpu_s"] for r in runs]
            wall_ratios = [r["with"]["wall_s"] / r["without"]["wall_s"] for r in runs]
            summary = {
                "cpu_s_without": spread(cpu_without), "cpu_s_with": spread(cpu_with),
                "cpu_ratio_of_medians": statistics.median(cpu_with) / statistics.median(cpu_without),
                "cpu_paired_ratio": spread(ratios),
                "wall_s_paired_ratio": spread(wall_ratios),
            }
            report["suites"][suite] = {"runs": runs, "summary": summary}
            pr = summary["cpu_paired_ratio"]
            print(f"{suite}: CPU s median without {statistics.median(cpu_without):.3f}, with {statistics.median(cpu_with):.3f}; "
                  f"with/without: ratio of medians {summary['cpu_ratio_of_medians']:.3f}, paired ratios median "
                  f"{pr['median']:.3f} (quartiles {pr['q1']:.3f}-{pr['q3']:.3f}, {args.repeat} pairs); wall time "
                  f"with/without, paired median {summary['wall_s_paired_ratio']['median']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
