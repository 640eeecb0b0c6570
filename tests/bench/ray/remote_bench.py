#!/usr/bin/env python3
"""The call patterns of `troupe bench remote` on Ray actors, on this machine.

A local Ray cluster (one node: GCS, raylet, object store) is started by this
script; the driver (this process) calls an actor that lives in its own Ray
worker process, so every call crosses processes over loopback as troupe's and
CAF's do. The workloads follow tests/bench/remote_bench.cpp:

  call_sync     one call at a time, ray.get() on each (2 k after 200 of warm-up)
  call_async    1000 calls in flight, each completion starting the next
                (1000 asyncio tasks awaiting their ObjectRefs), 20 k calls
  bulk          1 MiB bytes payloads, 8 in flight, 256 of them; the reply is
                the size
  remote_spawn  N actors created (num_cpus=0 so that they do not wait for free
                CPUs), then one call to each: Ray creates actors concurrently
                and in no set order, so the last one answering would not mean
                that all exist
  failover      the actor's worker process is killed with SIGKILL while 100
                calls wait on it (it sleeps in the first); ms until every call
                has failed with RayActorError. Ray has one node here, so this
                kills the actor's process, not a node

The counts are smaller than troupe's (Ray runs at a few thousand calls per
second, and each Ray actor is a process of its own); the metrics are rates, so
they compare all the same.

  remote_bench.py [--json] [--quick] [--only NAME] [--num-cpus N]

With --json every result is one line:
  {"suite":"ray_remote","bench":NAME,"metric":METRIC,"value":X,"unit":U}

Ray is not a dependency of troupe; install it for this comparison only
(python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray).
Exits 0 on success, 1 when a workload fails, 2 on a bad argument or when Ray
cannot be imported.
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time

WORKLOADS = ("call_sync", "call_async", "bulk", "remote_spawn", "failover")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON object per result line")
    p.add_argument("--quick", action="store_true", help="smaller sizes")
    p.add_argument("--only", choices=WORKLOADS, help="run one workload")
    p.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1,
                   help="CPUs the Ray node offers (default: every core)")
    args = p.parse_args()
    if args.num_cpus < 1:
        p.error("--num-cpus needs a positive count")
    return args


class Reporter:
    def __init__(self, as_json):
        self.as_json = as_json

    def __call__(self, bench, metric, value, unit):
        if self.as_json:
            print(json.dumps({"suite": "ray_remote", "bench": bench, "metric": metric,
                              "value": round(value, 3), "unit": unit},
                             separators=(",", ":")), flush=True)
        else:
            print(f"{bench:<14} {metric:<18} {value:14.3f} {unit}", flush=True)


class WorkloadError(Exception):
    pass


def check(ok, what):
    if not ok:
        raise WorkloadError(what)


def main():
    args = parse_args()
    try:
        import ray
    except ImportError as e:
        print(f"remote_bench.py: cannot import ray ({e}); install it for this comparison only: "
              "python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray", file=sys.stderr)
        return 2
    from ray.exceptions import RayActorError

    @ray.remote
    class RemoteEcho:
        """The counterpart of troupe's remote_echo: ping, take and hold."""

        def ping(self, x):
            return x + 1

        def take(self, payload):
            return len(payload)

        def hold(self, ms):
            time.sleep(ms / 1000)

        def pid(self):
            return os.getpid()

    report = Reporter(args.json)
    wants = lambda name: args.only is None or args.only == name
    # The node on loopback, as troupe's and CAF's peers are.
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1",
             logging_level="ERROR", object_store_memory=1 << 30)
    if not args.json:
        print(f"remote_bench.py: Ray {ray.__version__}, {args.num_cpus} CPUs"
              f"{', quick sizes' if args.quick else ''}", flush=True)
    try:
        echo = RemoteEcho.remote()
        check(ray.get(echo.ping.remote(0), timeout=120) == 1, "the actor answered wrong")

        if wants("call_sync"):
            rounds = 200 if args.quick else 2_000

            def calls(n):
                for i in range(n):
                    check(ray.get(echo.ping.remote(i), timeout=60) == i + 1,
                          "a reply did not match its call")

            calls(rounds // 10)
            t0 = time.perf_counter()
            calls(rounds)
            s = time.perf_counter() - t0
            report("call_sync", "calls_per_s", rounds / s, "calls/s")
            report("call_sync", "round_trip_us", s * 1e6 / rounds, "us")

        async def windowed(total, window, call, valid):
            # `window` lanes share one counter: each reply starts the next call.
            it = iter(range(total))

            async def lane():
                for i in it:
                    v = await call(i)
                    check(valid(i, v), "a reply did not match its call")

            t0 = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(window))), 300)
            return time.perf_counter() - t0

        if wants("call_async"):
            n = 2_000 if args.quick else 20_000
            s = asyncio.run(windowed(n, 1000, lambda i: echo.ping.remote(i),
                                     lambda i, v: v == i + 1))
            report("call_async", "calls_per_s", n / s, "calls/s")

        if wants("bulk"):
            n = 32 if args.quick else 256
            mib = 1 << 20
            payload = bytes((i * 131) % 251 for i in range(mib))
            s = asyncio.run(windowed(n, 8, lambda i: echo.take.remote(payload),
                                     lambda i, v: v == mib))
            report("bulk", "MB_per_s", n * mib / 1e6 / s, "MB/s")

        if wants("remote_spawn"):
            n = 4 if args.quick else 16
            t0 = time.perf_counter()
            spawned = [RemoteEcho.options(num_cpus=0).remote() for _ in range(n)]
            replies = ray.get([a.ping.remote(1) for a in spawned], timeout=300)
            s = time.perf_counter() - t0
            check(replies == [2] * n, "a spawned actor answered wrong")
            report("remote_spawn", "actors_per_s", n / s, "actors/s")
            for a in spawned:
                ray.kill(a)

        if wants("failover"):
            doomed = RemoteEcho.options(num_cpus=0).remote()
            pid = ray.get(doomed.pid.remote(), timeout=120)
            waiting = [doomed.hold.remote(60_000) for _ in range(100)]
            time.sleep(0.05)
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            for ref in waiting:
                try:
                    ray.get(ref, timeout=60)
                    raise WorkloadError("a call to the killed actor succeeded")
                except RayActorError:
                    pass
            report("failover", "ms_until_asks_fail", (time.perf_counter() - t0) * 1e3, "ms")
    except (WorkloadError, ray.exceptions.GetTimeoutError, asyncio.TimeoutError) as e:
        print(f"remote_bench.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
