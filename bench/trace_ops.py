"""Read a trace written by `bench.profile_steps --trace`: GPU-busy time, the slowest host operations, and what
makes the host wait for the GPU.

usage: python -m bench.trace_ops TRACE.trace.json.gz [--steps 6] [--top 15] [--pause-ms 10] [--idle-ms 2]
           [--depth 4] [--work REGEX]

Looks at the thread that launches the most CUDA work (the training loop). For each operation name: calls per
step, median and largest duration, total per step. For each `cudaStreamSynchronize`: the chain of operations
around it (innermost four), so a wait can be traced to the code that caused it. Pauses: stretches of at least
--pause-ms in which the training thread ran no operation at all (it waited for the backward pass, which runs on
its own thread, or was held off the interpreter by another thread), with the operations before and after. GPU
idle: stretches of at least --idle-ms without GPU work, with the operations the training thread started in each.
GPU time by source: each kernel's time, grouped by its name and the innermost operations around the call that
launched it (on any thread: the backward pass launches from its own), so that a kernel such as a copy can be traced
to the code that asked for it; kernels replayed from a CUDA graph are grouped under the graph launch. `--depth`
operations around each launch (innermost), each with its inputs' shapes where the trace has them (`bench.part_times
--trace` records them); `--work` keeps only the kernels whose name it finds (`--work copy` for the copies).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

from bench.profile_steps import union_seconds

GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # not "gpu_user_annotation": a label, not work
# the host's calls that start GPU work: CUDA runtime calls, and driver calls (Triton launches its kernels with these)
LAUNCHES = ("cuda_runtime", "cuda_driver")


def load_events(path: str) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as handle:
        return [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]


def host_ops(events: list[dict[str, Any]], steps: int, top: int) -> list[dict[str, Any]]:
    """The training thread's operations with the most total time, each with its duration spread (ms)."""
    durations: dict[str, list[float]] = defaultdict(list)
    for event in events:
        durations[event["name"]].append(event["dur"] / 1e3)
    ranked = sorted(durations.items(), key=lambda item: -sum(item[1]))[:top]
    return [
        {
            "name": name[:100],
            "calls_per_step": round(len(values) / steps, 1),
            "median_ms": round(statistics.median(values), 3),
            "max_ms": round(max(values), 1),
            "ms_per_step": round(sum(values) / steps, 1),
        }
        for name, values in ranked
    ]


def wait_sources(events: list[dict[str, Any]], steps: int, top: int) -> list[dict[str, Any]]:
    """Each `cudaStreamSynchronize`, grouped by the innermost four operations that enclose it."""
    ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "user_annotation")), key=lambda e: e["ts"])
    starts = [e["ts"] for e in ops]
    groups: Counter[tuple[str, ...]] = Counter()
    seconds: dict[tuple[str, ...], float] = defaultdict(float)
    for wait in (e for e in events if e["name"] == "cudaStreamSynchronize"):
        # enclosing ops start at or before the wait and end after it; a short look-back suffices (ops nest)
        index = bisect.bisect_right(starts, wait["ts"])
        around = [e for e in ops[max(index - 3000, 0) : index] if e["ts"] + e["dur"] >= wait["ts"]]
        chain = tuple(e["name"] for e in around[-4:])
        groups[chain] += 1
        seconds[chain] += wait["dur"] / 1e6
    return [
        {
            "inside": list(chain),
            "per_step": round(count / steps, 1),
            "ms_per_step": round(seconds[chain] / steps * 1e3, 1),
        }
        for chain, count in groups.most_common(top)
    ]


def host_pauses(events: list[dict[str, Any]], steps: int, min_ms: float) -> dict[str, Any]:
    """Stretches of at least `min_ms` in which the thread ran no operation: when, how long, between which ops."""
    ops = sorted(events, key=lambda e: e["ts"])
    if not ops:
        return {"ms_per_step": 0.0, "pauses": []}
    origin, reach, last = ops[0]["ts"], ops[0]["ts"] + ops[0]["dur"], ops[0]
    pauses = []
    for event in ops[1:]:
        if event["ts"] - reach >= min_ms * 1e3:
            pauses.append(
                {
                    "at_ms": round((reach - origin) / 1e3, 1),
                    "ms": round((event["ts"] - reach) / 1e3, 1),
                    "after": last["name"][:60],
                    "before": event["name"][:60],
                }
            )
        if event["ts"] + event["dur"] > reach:
            reach, last = event["ts"] + event["dur"], event
    return {"ms_per_step": round(sum(p["ms"] for p in pauses) / steps, 1), "pauses": pauses}


def gpu_idle_stretches(
    gpu: list[tuple[float, float]], host: list[dict[str, Any]], steps: int, min_ms: float
) -> dict[str, Any]:
    """Stretches of at least `min_ms` in which the GPU ran nothing (between its first and last work), each with
    the training thread's operations that started in it, most frequent first: what the host did meanwhile."""
    merged: list[list[float]] = []
    for start, end in sorted(gpu):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    ops = sorted((e for e in host if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    starts = [e["ts"] for e in ops]
    stretches = []
    for (_, idle_from), (idle_to, _) in zip(merged, merged[1:], strict=False):
        if idle_to - idle_from < min_ms * 1e3:
            continue
        inside = ops[bisect.bisect_left(starts, idle_from) : bisect.bisect_left(starts, idle_to)]
        stretches.append(
            {
                "at_ms": round((idle_from - merged[0][0]) / 1e3, 1),
                "ms": round((idle_to - idle_from) / 1e3, 1),
                "host_ops": [f"{n} x{c}" for n, c in Counter(e["name"][:40] for e in inside).most_common(4)],
            }
        )
    return {"ms_per_step": round(sum(s["ms"] for s in stretches) / steps, 1), "stretches": stretches}


def kernel_sources(
    events: list[dict[str, Any]], steps: int, top: int, depth: int = 4, work_name: str = ""
) -> dict[str, Any]:
    """GPU kernel, copy and memset time per step, grouped by (work name, innermost `depth` operations around its
    launch, each with its inputs' shapes where the trace recorded them), largest first; and the share launched
    outside CUDA graphs. With `work_name` (a regular expression), only the work whose name it finds."""
    launches = {
        e["args"]["correlation"]: e for e in events if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})
    }
    ops_by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event.get("cat") in ("cpu_op", "user_annotation"):
            ops_by_thread[event["tid"]].append(event)
    starts_by_thread = {}
    for tid, ops in ops_by_thread.items():
        ops.sort(key=lambda e: e["ts"])
        starts_by_thread[tid] = [e["ts"] for e in ops]
    seconds: dict[tuple[str, ...], float] = defaultdict(float)
    counts: Counter[tuple[str, ...]] = Counter()
    outside_graphs = 0.0
    for work in (e for e in events if e.get("cat") in GPU_WORK and re.search(work_name, e["name"])):
        launch = launches.get(work.get("args", {}).get("correlation"))
        chain: tuple[str, ...] = ()
        if launch is not None:
            ops, starts = ops_by_thread.get(launch["tid"], []), starts_by_thread.get(launch["tid"], [])
            index = bisect.bisect_right(starts, launch["ts"])
            around = [e for e in ops[max(index - 3000, 0) : index] if e["ts"] + e["dur"] >= launch["ts"]]
            chain = tuple(e["name"][:60] + str(e.get("args", {}).get("Input Dims", ""))[:200] for e in around[-depth:])
            if launch["name"] != "cudaGraphLaunch":
                outside_graphs += work["dur"] / 1e6
        key = (work["name"][:80], *chain)
        seconds[key] += work["dur"] / 1e6
        counts[key] += 1
    ranked = sorted(seconds.items(), key=lambda item: -item[1])[:top]
    return {
        "outside_cuda_graphs_ms_per_step": round(outside_graphs / steps * 1e3, 1),
        "by_source": [
            {
                "work": key[0],
                "launched_inside": list(key[1:]),
                "per_step": round(counts[key] / steps, 1),
                "ms_per_step": round(value / steps * 1e3, 2),
            }
            for key, value in ranked
        ],
    }


def read_trace(
    path: str, steps: int, top: int, pause_ms: float = 10.0, idle_ms: float = 2.0, depth: int = 4, work_name: str = ""
) -> dict[str, Any]:
    events = load_events(path)
    gpu = [(round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)) for e in events if e.get("cat") in GPU_WORK]
    threads = Counter(e["tid"] for e in events if e.get("cat") in LAUNCHES)
    training_thread = threads.most_common(1)[0][0]
    host = [e for e in events if e["tid"] == training_thread and e.get("cat") in ("cpu_op", *LAUNCHES)]
    return {
        "trace": path,
        "gpu_busy_ms_per_step": round(union_seconds(gpu) / steps * 1e3, 1),
        "host_ops": host_ops(host, steps, top),
        "host_waits": wait_sources(host, steps, top),
        "host_pauses": host_pauses(host, steps, pause_ms),
        "gpu_idle": gpu_idle_stretches(
            [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_WORK], host, steps, idle_ms
        ),
        "gpu_time_by_source": kernel_sources(events, steps, top, depth, work_name),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=6, help="profiled steps in the trace")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--pause-ms", type=float, default=10.0, help="shortest pause of the training thread listed")
    parser.add_argument("--idle-ms", type=float, default=2.0, help="shortest stretch without GPU work listed")
    parser.add_argument("--depth", type=int, default=4, help="operations around each kernel's launch, innermost")
    parser.add_argument("--work", default="", help="GPU time by source: only kernels whose name this finds")
    args = parser.parse_args()
    reading = read_trace(args.trace, args.steps, args.top, args.pause_ms, args.idle_ms, args.depth, args.work)
    print(json.dumps(reading, indent=1))


if __name__ == "__main__":
    main()
