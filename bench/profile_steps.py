"""Where a training step of the notebook's recipe spends its time: how busy the GPU is, and on what.

usage: python -m bench.profile_steps --dataset DIR --out FILE.json [--batch 128] [--start 30] [--steps 6]
           [--variant stock|eager|eager_graphs|te_graphs] [--speedups none|all|NAME,...|all,-NAME,+NAME,...]
           [--loader-niceness N]
           [--threads N] [--sync-debug] [--resolution N] [--trace] [--cudnn-benchmark] [--kernels 25]

Runs the notebook's `train()` call (bench.stock_recipe) with the speedups of the workflow's registry that
`--speedups` names (`python -m rfdetr_coco_pipeline.hooks` lists them; `static_cuda_graphs` also turns on compile and
cuda_graphs). Steps [start - 2*steps, start) are timed with no profiler (the rate a user gets); steps
[start, start + steps) run under torch.profiler. Then it writes, per step: wall seconds, GPU-busy seconds (the union
of every kernel, copy and memset interval on the device), the host seconds of each phase of Lightning's step
(forward + loss, backward, optimizer + callbacks, waiting for data), the host's time blocked in synchronising CUDA
calls, call counts, and the `--kernels` kernels that take most GPU time (all of them, set beside `bench.part_times
--kernels N`'s whole step, show the work a training step does beyond the model's); also the seconds before the timed
steps (start-up, compile or compile-cache loads, first steps) and torch.compile's cache lookups by then. Then the
process exits, before any validation. `--cudnn-benchmark` lets cuDNN time its algorithms per shape; Inductor's
settings come from the environment (e.g. TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, TORCHINDUCTOR_ENABLE_PDL=1): the
result records every TORCHINDUCTOR_ variable set, and the run's name coordinate descent.

If the GPU is busy a fraction f of a step, a step made of the same kernels cannot run faster than f times the
step's time however little the host does: 1/f is the ceiling on the speed-up from removing host overhead. Where the
GPU was busy under 90 % of the profiled steps, the result's `profiled.host_held_the_steps` (and stderr) says so: the
host held them, and their rate is the host's. Its defaults are the notebook's (torch's threads, workers not niced);
the train stage's are `--threads 1 --loader-niceness 10`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from rfdetr_coco_pipeline.common import run_stage
from rfdetr_coco_pipeline.training.callbacks.epoch_log import compile_cache_counts

# (compile, cuda_graphs) of each variant; te_graphs is the notebook's USE_TE_GRAPHS route (FP8, Transformer Engine)
VARIANTS = {"stock": (None, None), "eager": (False, False), "eager_graphs": (False, True), "te_graphs": (None, None)}
# Host-side CUDA calls that wait for the GPU (a blocking copy to the host is a cudaMemcpyAsync that waits too).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def thread_usage_per_step(before: resource.struct_rusage, steps: int) -> dict[str, float]:
    """This thread's context switches, page faults and CPU seconds since `before`, per step."""
    after = resource.getrusage(resource.RUSAGE_THREAD)
    fields = {
        "involuntary_switches": "ru_nivcsw",
        "voluntary_switches": "ru_nvcsw",
        "minor_faults": "ru_minflt",
        "major_faults": "ru_majflt",
        "user_seconds": "ru_utime",
        "system_seconds": "ru_stime",
    }
    return {name: round((getattr(after, f) - getattr(before, f)) / steps, 4) for name, f in fields.items()}


KERNEL_NAME_CHARS = 120  # C++ kernel names run to thousands of characters; the first 120 tell them apart


def union_seconds(intervals: list[tuple[int, int]]) -> float:
    """Total length, in seconds, covered by nanosecond intervals that may overlap (kernels on several streams)."""
    covered, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            covered += end - start
            reach = end
        elif end > reach:
            covered += end - reach
            reach = end
    return covered / 1e9


def summarize_events(events: list[tuple[str, bool, int, int]], steps: int, top: int = 25) -> dict[str, Any]:
    """Per-step GPU busy seconds, CUDA call counts and the top kernels, from (name, on_gpu, start_ns, end_ns)."""
    gpu = [(start, end) for _, on_gpu, start, end in events if on_gpu]
    kernel_seconds: dict[str, float] = defaultdict(float)
    host_seconds: dict[str, float] = defaultdict(float)  # inclusive: an op's time includes the ops it calls
    calls: Counter[str] = Counter()
    sync_seconds = 0.0
    for name, on_gpu, start, end in events:
        if on_gpu:
            kernel_seconds[name[:KERNEL_NAME_CHARS]] += (end - start) / 1e9  # names cut alike count as one
        else:
            calls[name] += 1
            host_seconds[name] += (end - start) / 1e9
            if name in SYNC_CALLS:
                sync_seconds += (end - start) / 1e9
    busiest = sorted(kernel_seconds.items(), key=lambda item: -item[1])[:top]
    host_ops = sorted(host_seconds.items(), key=lambda item: -item[1])[: 2 * top]
    return {
        "gpu_busy_seconds_per_step": round(union_seconds(gpu) / steps, 4),
        "gpu_kernel_seconds_per_step": round(sum(kernel_seconds.values()) / steps, 4),
        "host_blocked_in_sync_seconds_per_step": round(sync_seconds / steps, 4),
        "per_step_counts": {
            "gpu_activities": round(len(gpu) / steps, 1),
            "kernel_launches": round(sum(calls[name] for name in LAUNCH_CALLS) / steps, 1),
            "memcpy_calls": round(calls["cudaMemcpyAsync"] / steps, 1),
            "sync_calls": round(sum(calls[name] for name in SYNC_CALLS) / steps, 1),
            "item_calls": round(calls["aten::_local_scalar_dense"] / steps, 1),
        },
        "top_kernels_ms_per_step": [[name, round(seconds / steps * 1e3, 2)] for name, seconds in busiest],
        "top_host_ops_inclusive_ms_per_step": [
            [name[:120], round(seconds / steps * 1e3, 2), round(calls[name] / steps)] for name, seconds in host_ops
        ],
    }


def host_holds_warning(busy_seconds: float, step_seconds: float, threads: int) -> str | None:
    """A warning when the GPU was busy under 90 % of the profiled steps: the host held them, so their rate measures
    the host (with torch's many threads, the loader's workers and the training process compete for the cores)."""
    if not step_seconds or busy_seconds / step_seconds >= 0.9:
        return None
    hint = " The train stage runs one: pass --threads 1 --loader-niceness 10." if threads > 1 else ""
    return (
        f"The GPU was busy {busy_seconds / step_seconds:.0%} of the profiled steps: the host held them, so their rate "
        f"measures the host, not the GPU's work. This run used {threads} host thread{'s' * (threads != 1)}.{hint}"
    )


def annotation_names(events: Iterable[Any]) -> set[str]:
    """The names of the user annotations among torch.profiler's kineto `events`: labels (Lightning's
    "Optimizer.step", torch's "Optimizer.step#AdamW.step") that the GPU's timeline shows around work, but no work."""
    return {event.name() for event in events if event.is_user_annotation()}


def seconds_since_process_start() -> float:
    """Seconds since this process started: /proc/self/stat's start time against the system's uptime (Linux)."""
    with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


class StepProfile(pl.Callback):
    """Times the steps before `start`, profiles `steps` steps from it, writes the summary to `out` (and, with
    `trace`, the profiled steps' trace beside it) and ends the process. `variant` names the run in the summary;
    `sync_debug` warns, with file and line, where a profiled step waits for the GPU."""

    def __init__(
        self,
        start: int,
        steps: int,
        out: Path,
        batch: int,
        variant: str,
        trace: bool = False,
        sync_debug: bool = False,
        kernels: int = 25,
    ) -> None:
        self.start, self.steps, self.out, self.batch, self.kernels = start, steps, out, batch, kernels
        self.trace, self.sync_debug = trace, sync_debug
        self.cuda = torch.cuda.is_available()
        self.step = 0
        self.timed_from = max(start - 2 * steps, 1)
        self.phases: dict[str, float] = defaultdict(float)
        self.last = 0.0
        self.result: dict[str, Any] = {"variant": variant, "batch": batch, "profiled_steps": steps}
        self.gc_runs: Counter[int] = Counter()
        self.gc_seconds = 0.0
        self.gc_started = 0.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_gc(self, phase: str, info: dict[str, int]) -> None:
        """Python's garbage collections in the timed steps: how many of each generation, how long in all."""
        if phase == "start":
            self.gc_started = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self.gc_started
            self.gc_runs[info["generation"]] += 1

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        if self.step >= self.start:
            self.phases[phase] += now - self.last
        self.last = now

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch_: Any, idx: int) -> None:
        if self.step == self.timed_from:
            self.sync()
            self.timed_started = time.perf_counter()
            # the process's start, model build, compile (or compile-cache loads) and first steps
            self.result["seconds_before_timed_steps"] = round(seconds_since_process_start(), 1)
            self.result["compile_cache"] = compile_cache_counts()  # by then every graph is compiled or loaded
            self.thread_usage = resource.getrusage(resource.RUSAGE_THREAD)
            gc.callbacks.append(self.time_gc)
        if self.step == self.start:
            self.sync()
            seconds = time.perf_counter() - self.timed_started
            timed = self.start - self.timed_from
            gc.callbacks.remove(self.time_gc)
            self.result["unprofiled"] = {
                "steps": timed,
                "seconds_per_step": round(seconds / timed, 4),
                "images_per_second": round(timed * self.batch / seconds, 1),
                "garbage_collections_per_step": {
                    f"generation {g}": round(n / timed, 2) for g, n in sorted(self.gc_runs.items())
                },
                "garbage_collection_seconds_per_step": round(self.gc_seconds / timed, 4),
                # the training thread taken off its core (involuntary) or waiting (voluntary), per step
                "training_thread_per_step": thread_usage_per_step(self.thread_usage, timed),
                "load_average_1min": os.getloadavg()[0],
            }
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            # each place where the host waits for the GPU warns once, with file and line
            if self.sync_debug and self.cuda:
                torch.cuda.set_sync_debug_mode("warn")
            self.profiler.start()
            self.profile_started = time.perf_counter()
            self.last = self.profile_started
        self.mark("waiting_for_data")

    def on_before_backward(self, trainer: pl.Trainer, module: pl.LightningModule, loss: Any) -> None:
        self.mark("forward_and_loss")

    def on_after_backward(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.mark("backward")

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch_: Any, idx: int
    ) -> None:
        self.mark("optimizer_and_callbacks")
        self.step += 1
        if self.step == self.start + self.steps:
            self.sync()
            wall = time.perf_counter() - self.profile_started
            self.profiler.stop()
            if self.sync_debug and self.cuda:
                torch.cuda.set_sync_debug_mode("default")
            self.finish(wall)

    def finish(self, wall: float) -> None:
        from rfdetr.models.matcher import HungarianMatcher
        from torch.autograd import DeviceType

        flags = getattr(HungarianMatcher._match_many, "safety_flags", None)  # matching_without_waiting
        if flags is not None:
            self.result["matchings"] = {
                "queued": flags.steps,
                "left_to_rfdetr": flags.declined,
                "failed": flags.failed,
            }

        # GPU activities: kernels, copies, memsets. Annotations shown on the GPU's timeline (Lightning's
        # "Optimizer.step" spans the whole step) are not work and are left out.
        kineto = self.profiler.profiler.kineto_results.events()
        annotations = annotation_names(kineto)
        events = [
            (e.name(), e.device_type() == DeviceType.CUDA, e.start_ns(), e.start_ns() + e.duration_ns())
            for e in kineto
            if e.name() not in annotations
        ]
        summary = summarize_events(events, self.steps, self.kernels)
        busy = summary["gpu_busy_seconds_per_step"]
        self.result["profiled"] = {
            "seconds_per_step": round(wall / self.steps, 4),
            "images_per_second": round(self.steps * self.batch / wall, 1),
            "host_phase_seconds_per_step": {k: round(v / self.steps, 4) for k, v in self.phases.items()},
            **summary,
        }
        base = self.result["unprofiled"]["seconds_per_step"]
        self.result["gpu_busy_fraction"] = round(busy / base, 3) if self.cuda else None
        self.result["ceiling_speedup_without_host_overhead"] = round(base / busy, 2) if self.cuda and busy else None
        self.result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1) if self.cuda else None
        warning = host_holds_warning(busy, wall / self.steps, torch.get_num_threads()) if self.cuda else None
        self.result["profiled"]["host_held_the_steps"] = warning
        self.out.write_text(json.dumps(self.result, indent=1) + "\n")
        if warning:
            print(warning, file=sys.stderr, flush=True)
        if self.trace:  # the whole timeline, for a look in Perfetto or chrome://tracing (torch gzips a .gz name)
            self.profiler.export_chrome_trace(str(self.out.with_suffix(".trace.json.gz")))
        print(json.dumps(self.result, indent=1), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the measurement is written; validation and checkpoints would only cost time


def parse_speedups(value: str) -> str | list[str]:
    """--speedups: none, all, names separated by commas, or all (as train.speedups: all) but some and with others:
    "all,-name,+name"."""
    from rfdetr_coco_pipeline.hooks import NAMES, wanted_names

    if value in ("none", "all"):
        return value
    names = [name for name in value.split(",") if name]
    if names[0] != "all":
        return names
    left_out = {name.removeprefix("-") for name in names[1:] if name.startswith("-")}
    added = [name.removeprefix("+") for name in names[1:] if name.startswith("+")]
    unknown = (left_out | set(added)) - set(NAMES)
    if unknown or len(left_out) + len(added) != len(names) - 1:
        raise ValueError(f"not speedups, or without - or +: {sorted(unknown) or names[1:]}")
    return [name for name in wanted_names(["all", *added]) if name not in left_out]


def inductor_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The TORCHINDUCTOR_ variables of `environ`, sorted by name: the Inductor settings a run took from its
    environment, which its result must name to be told apart from a run without them."""
    return {key: environ[key] for key in sorted(environ) if key.startswith("TORCHINDUCTOR_")}


def main() -> None:
    from types import SimpleNamespace

    from rfdetr_coco_pipeline.hooks import BY_DEFAULT, applied, select_speedups
    from rfdetr_coco_pipeline.versions import package_version

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--start", type=int, default=30, help="first profiled step (after compile warm-up)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="stock")
    parser.add_argument("--resolution", type=int, help="leave unset for the notebook's 384 px")
    parser.add_argument(
        "--speedups", type=parse_speedups, default="none", help="none, all, NAME,NAME or all,-NAME,+NAME"
    )
    parser.add_argument("--loader-niceness", type=int, default=0, help="for the nice_loader_workers speedup")
    parser.add_argument(
        "--sync-debug", action="store_true", help="warn (file and line) where the profiled steps wait for the GPU"
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the training process (default: torch's)")
    parser.add_argument("--trace", action="store_true", help="also write the profiled steps as <out>.trace.json.gz")
    parser.add_argument(
        "--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape (torch's default: off)"
    )
    parser.add_argument(
        "--kernels",
        type=int,
        default=25,
        help="kernels listed, most GPU time first (set beside `bench.part_times --kernels N`'s whole step)",
    )
    args = parser.parse_args()
    from bench.stock_recipe import train_like_notebook

    selection = select_speedups(args.speedups, package_version("rfdetr"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    compile_, graphs = VARIANTS[args.variant]
    if "static_cuda_graphs" in selection.names():
        compile_, graphs = True, True
    import torch._inductor.config as inductor_config

    torch.backends.cudnn.benchmark = args.cudnn_benchmark  # Lightning's Trainer(benchmark=None) keeps this value
    default_threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    # the variant and the speedups of `all` left out and those added (or those applied, when fewer): a short name
    chosen = selection.names()
    left_out = [name for name in BY_DEFAULT if name not in chosen]
    added = [name for name in chosen if name not in BY_DEFAULT]
    short = ["all", *(f"-{n}" for n in left_out), *(f"+{n}" for n in added)]
    name = "+".join([args.variant, *(chosen if len(chosen) <= len(left_out) else short)])
    name += f"+nice{args.loader_niceness}" if args.loader_niceness else ""
    name += f"+threads{args.threads}" if args.threads else ""
    name += "+cudnn_benchmark" if args.cudnn_benchmark else ""
    # TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 in the environment turns this on
    name += "+coordinate_descent" if inductor_config.coordinate_descent_tuning else ""
    callback = StepProfile(
        args.start,
        args.steps,
        args.out,
        args.batch,
        name,
        trace=args.trace,
        sync_debug=args.sync_debug,
        kernels=args.kernels,
    )
    callback.result["host_threads"] = {"default": default_threads, "used": torch.get_num_threads()}
    callback.result["speedups"] = selection.names()
    callback.result["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    callback.result["coordinate_descent_tuning"] = inductor_config.coordinate_descent_tuning
    callback.result["inductor_environment"] = inductor_environment(os.environ)
    with applied(selection, SimpleNamespace(loader_niceness=args.loader_niceness)) as speedup_callbacks:
        train_like_notebook(
            args.dataset,
            args.out.parent / f"run-{name}",
            1,
            args.batch,
            [*speedup_callbacks, callback],
            compile_,
            graphs,
            args.resolution,
            use_te_graphs=args.variant == "te_graphs",
        )
    raise SystemExit(f"training ended before step {args.start + args.steps}: use a larger set or a smaller --start")


if __name__ == "__main__":
    run_stage(main)
