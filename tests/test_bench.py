"""The benchmark comparison that BENCHMARKS.md is built from: ratios against the stock run, and loss curves
compared image for image when the batch differs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.side_by_side import loss_difference, on_the_same_images, side_by_side

REPO = Path(__file__).resolve().parents[1]


def run(images_per_second: float, losses: list[float], batch: int) -> dict:
    return {
        "steady_images_per_second": images_per_second,
        "epoch0_overhead_seconds": 10.0,
        "first_validation_seconds": 5.0,
        "peak_memory_gb": 1.0,
        "records": [{"epoch": 0, "images": batch * len(losses), "loss": losses}],
    }


def test_the_summary_gives_each_epochs_rate_and_its_wait_for_the_previous_epochs_checkpoint():
    from bench.compare import summarize

    records = [
        {"epoch": e, "images": 1000, "train_seconds": t, "val_seconds": 1.0, "images_per_second": 1000 / t}
        | {"since_previous_epoch_seconds": gap, "peak_memory_gb": 1.0}
        for e, t, gap in ((0, 20.0, None), (1, 10.0, 1.5), (2, 10.0, 0.2))
    ]
    summary = summarize(records)
    assert summary["steady_images_per_second"] == 100.0 and summary["epoch0_overhead_seconds"] == 10.0
    assert summary["since_previous_epoch_seconds"] == [None, 1.5, 0.2]


def test_a_twice_larger_batch_is_compared_with_the_mean_of_two_reference_steps():
    assert on_the_same_images([4.0, 2.0, 6.0, 8.0, 1.0], 2) == [3.0, 7.0]  # a lone last step has no partner


def test_loss_differences_are_taken_over_the_steps_both_runs_made():
    difference = loss_difference([10.0, 10.0, 10.0], [11.0, 9.0])
    assert difference["steps"] == 2
    assert difference["mean_abs_difference"] == 1.0 and difference["max_abs_difference"] == 1.0
    assert difference["mean_abs_difference_relative"] == pytest.approx(0.1)


def test_every_run_gets_its_ratio_to_the_first_stock_run_and_its_loss_difference():
    summaries = {
        "call": {
            "stock": run(300.0, [10.0, 8.0, 6.0, 4.0], batch=128),
            "bigger_batch": run(450.0, [9.5, 5.0], batch=256),
        }
    }
    table = side_by_side(summaries)
    assert table["reference"] == "call/stock"
    lever = table["runs"]["call/bigger_batch"]
    assert lever["ratio_to_reference"] == 1.5
    assert lever["loss_vs_reference"]["reference_steps_averaged"] == 2
    assert lever["loss_vs_reference"]["mean_abs_difference"] == 0.25  # (|9.5 - 9| + |5 - 5|) / 2


def test_every_pair_of_runs_across_calls_gets_its_loss_difference_and_its_kind():
    from bench.loss_pairs import loss_pairs
    from bench.side_by_side import named_runs

    runs = named_runs(
        {
            "callA-summary": {"stock": run(300.0, [10.0, 8.0], batch=128)},
            "callB-summary": {"stock": run(310.0, [10.0, 8.5], batch=128), "lever": run(600.0, [9.0, 8.0], batch=128)},
        }
    )
    rows = {tuple(row["pair"]): row for row in loss_pairs(runs)}
    assert set(rows) == {
        ("callA-summary/stock", "callB-summary/stock"),
        ("callA-summary/stock", "callB-summary/lever"),
        ("callB-summary/stock", "callB-summary/lever"),
    }
    noise = rows[("callA-summary/stock", "callB-summary/stock")]
    assert noise["kind"] == "stock-stock" and noise["mean_abs_difference"] == 0.25
    assert rows[("callB-summary/stock", "callB-summary/lever")]["kind"] == "stock-other"
    assert rows[("callB-summary/stock", "callB-summary/lever")]["mean_abs_difference"] == 0.75
    first_step_only = {tuple(row["pair"]): row for row in loss_pairs(runs, first_steps=1)}
    assert first_step_only[("callB-summary/stock", "callB-summary/lever")]["mean_abs_difference"] == 1.0
    assert all("random_numbers_part_at_epoch" not in row for row in rows.values())  # runs logged without digests


def test_pairs_grouped_by_kind_give_each_groups_spread_and_each_kinds_last_losses(tmp_path, monkeypatch, capsys):
    from bench.loss_pairs import main

    def steps(loss: float) -> dict:
        return run(300.0, [loss] * 20, batch=128)

    summaries = {
        "call1-summary-stock": {"stock": steps(10.0)},
        "call4-summary-stock2": {"stock2": steps(10.1)},  # stock2 is a stock run
        "summary-coldD": {"coldD": steps(10.2)},
        "summary-coldE": {"coldE": steps(10.4)},
        "summary-warmD": {"warmD": steps(10.0)},
    }
    for stem, summary in summaries.items():
        (tmp_path / f"{stem}.json").write_text(json.dumps(summary))
    args = ["bench.loss_pairs", "--by-kind", *(str(tmp_path / f"{stem}.json") for stem in summaries)]
    monkeypatch.setattr(sys, "argv", args)
    main()
    grouped = json.loads(capsys.readouterr().out)
    pairs = grouped["pairs"]
    assert set(pairs) == {"stock / stock", "cold / cold", "cold / stock", "cold / warm", "stock / warm"}
    # two stock runs 0.1 apart on a loss of 10: 1 %; the cold runs 0.2 apart on 10.2 (the pair's first run)
    assert pairs["stock / stock"] == {"pairs": 1, "least_percent": 1.0, "largest_percent": 1.0, "mean_percent": 1.0}
    assert pairs["cold / cold"]["pairs"] == 1 and pairs["cold / cold"]["mean_percent"] == pytest.approx(1.96, abs=0.01)
    # each cold run against each stock run: 4 pairs, from 0.1 (10.1 vs 10.2) to 0.4 (10.0 vs 10.4) apart
    cold_stock = pairs["cold / stock"]
    assert cold_stock["pairs"] == 4 and cold_stock["least_percent"] < cold_stock["mean_percent"]
    assert cold_stock["mean_percent"] < cold_stock["largest_percent"]
    assert grouped["last_20_steps_mean"]["cold"] == {"summary-coldD/coldD": 10.2, "summary-coldE/coldE": 10.4}
    assert set(grouped["last_20_steps_mean"]) == {"stock", "cold", "warm"}
    # the cold runs end at 10.2 and 10.4: their mean 10.3, their standard deviation 0.1414; one warm run has none
    assert grouped["last_20_steps_mean_by_kind"]["cold"] == {"runs": 2, "mean": 10.3, "sd": 0.1414}
    assert grouped["last_20_steps_mean_by_kind"]["warm"] == {"runs": 1, "mean": 10.0, "sd": None}
    # each run's mean difference from the stock runs, nearest first; a stock run's from the other stock run only
    to_stock = grouped["mean_percent_to_the_stock_runs"]
    assert list(to_stock)[0] == "summary-warmD/warmD" and list(to_stock)[-1] == "summary-coldE/coldE"
    assert to_stock["call1-summary-stock/stock"] == pytest.approx(1.0, abs=0.01)  # 10.0 vs 10.1 only
    assert to_stock["summary-warmD/warmD"] == pytest.approx((0.0 + 1.0) / 2, abs=0.01)  # 10.0 vs 10.0 and vs 10.1
    # and the signed drift, epoch by epoch (one epoch here): the cold runs end 2.5 % above the stock runs on average
    assert grouped["last_epoch_drift_by_kind"]["cold"]["runs"] == 2
    assert grouped["last_epoch_drift_by_kind"]["cold"]["mean"] == pytest.approx(100 * 0.25 / 10.05, abs=0.01)


def test_each_runs_signed_drift_from_the_stock_runs_is_given_epoch_by_epoch():
    from bench.loss_pairs import epoch_drift
    from bench.side_by_side import named_runs

    def epochs(*per_epoch: list[float]) -> dict:  # one record per epoch, its steps' losses
        logged = run(300.0, [], batch=128)
        logged["records"] = [
            {"epoch": e, "images": 128 * len(losses), "loss": losses} for e, losses in enumerate(per_epoch)
        ]
        return logged

    runs = named_runs(
        {
            "call": {
                "stock": epochs([10.0, 10.0], [8.0, 8.0]),
                "stock2": epochs([10.0, 10.0], [8.4, 8.4]),
                "offA": epochs([10.0, 10.0], [8.6, 8.8]),  # ends above both stock runs
                "offB": epochs([10.0, 10.0], [7.8, 8.2]),  # ends on their mean
            }
        }
    )
    drift = epoch_drift(runs)
    per_run = drift["epoch_drift_from_stock_percent"]
    # against the stock runs' mean, 10.0 then 8.2: offA lies (0.4 + 0.6) / 2 / 8.2 above it in its second epoch
    assert per_run["call/offA"] == [0.0, pytest.approx(100 * 0.5 / 8.2, abs=0.001)]
    assert per_run["call/offB"] == [0.0, pytest.approx(100 * (-0.4 / 8.2 + 0.0) / 2, abs=0.001)]
    # a stock run against the other stock run only: 8.0 against 8.4, and 8.4 against 8.0
    assert per_run["call/stock"][1] == pytest.approx(100 * -0.4 / 8.4, abs=0.001)
    assert per_run["call/stock2"][1] == pytest.approx(100 * 0.4 / 8.0, abs=0.001)
    off = drift["last_epoch_drift_by_kind"]["off"]
    assert off["runs"] == 2 and off["least"] == per_run["call/offB"][1] and off["largest"] == per_run["call/offA"][1]
    assert off["mean"] == pytest.approx((per_run["call/offA"][1] + per_run["call/offB"][1]) / 2, abs=0.001)
    # over the first 2 steps, the first epoch alone: nothing drifts yet
    assert epoch_drift(runs, first_steps=2)["epoch_drift_from_stock_percent"]["call/offA"] == [0.0]


def test_each_kinds_last_epoch_is_tested_against_the_stock_runs():
    from bench.loss_pairs import epoch_drift
    from bench.side_by_side import named_runs

    def ending(last: float) -> dict:  # a warm-up epoch every run shares, then one step of loss `last`
        logged = run(300.0, [], batch=128)
        logged["records"] = [{"epoch": 0, "images": 128, "loss": [10.0]}, {"epoch": 1, "images": 128, "loss": [last]}]
        return logged

    stock = [8.0, 8.1, 7.9, 8.05, 7.95, 8.02]
    runs = {f"stock{i}": ending(loss) for i, loss in enumerate(stock)}
    runs |= {f"high{i}": ending(loss + 0.5) for i, loss in enumerate(stock)}  # every run ends above every stock run
    runs |= {f"wide{i}": ending(8.0 + 6 * (loss - 8.0)) for i, loss in enumerate(stock)}  # same centre, 6x the spread
    runs |= {f"alike{i}": ending(loss + 0.001) for i, loss in enumerate(stock)}  # as the stock runs
    runs["lone"] = ending(9.0)
    tests = epoch_drift(named_runs({"call": runs}))["last_epoch_against_stock"]
    assert tests["high"]["location_p"] < 0.01 and tests["high"]["runs"] == tests["high"]["stock_runs"] == 6
    assert tests["wide"]["spread_p"] < 0.05 and tests["wide"]["location_p"] > 0.5
    assert tests["alike"]["location_p"] > 0.5 and tests["alike"]["spread_p"] > 0.5
    assert "lone" not in tests  # one run: no test
    assert tests["every other kind"]["runs"] == 19


def test_a_pair_says_from_which_epoch_its_runs_drew_other_random_numbers():
    from bench.loss_pairs import loss_pairs
    from bench.side_by_side import named_runs

    def digested(*digests: str) -> dict:  # one epoch of one step per digest, each starting in that state
        logged = run(300.0, [10.0], batch=128)
        logged["records"] = [
            {"epoch": epoch, "images": 128, "loss": [10.0], "rng_digests": {"cpu": digest}}
            for epoch, digest in enumerate(digests)
        ]
        return logged

    runs = named_runs({"call": {"stock": digested("a", "b"), "warm": digested("a", "b"), "cold": digested("a", "c")}})
    parts = {tuple(row["pair"]): row["random_numbers_part_at_epoch"] for row in loss_pairs(runs)}
    assert parts[("call/stock", "call/warm")] is None
    assert parts[("call/stock", "call/cold")] == parts[("call/warm", "call/cold")] == 1


def test_without_a_stock_run_it_says_what_to_run_first():
    with pytest.raises(SystemExit, match="bench.compare --only stock"):
        side_by_side({"call": {"lever": run(400.0, [1.0], batch=128)}})


def test_gpu_busy_time_counts_overlapping_kernels_once():
    from bench.profile_steps import union_seconds

    # two streams overlapping for 1 s, then a gap, then one more second: 3 s of the 4.5 s span are busy
    assert union_seconds([(0, 2_000_000_000), (1_000_000_000, 2_000_000_000), (3_500_000_000, 4_500_000_000)]) == 3.0
    assert union_seconds([]) == 0.0


def test_a_step_profile_separates_gpu_work_from_host_waits_and_counts_per_step():
    from bench.profile_steps import summarize_events

    events = [
        ("gemm", True, 0, 100_000_000),  # 0.1 s kernel
        ("gemm", True, 50_000_000, 150_000_000),  # overlapping on another stream
        ("copy", True, 150_000_000, 150_002_000),
        ("cudaStreamSynchronize", False, 150_000_000, 200_000_000),
        ("cudaLaunchKernel", False, 0, 1_000),
        ("cudaLaunchKernel", False, 1_000, 2_000),
        ("aten::_local_scalar_dense", False, 200_000_000, 200_001_000),
    ]
    summary = summarize_events(events, steps=2)
    assert summary["gpu_busy_seconds_per_step"] == 0.075  # 0.150002 s covered over 2 steps
    assert summary["gpu_kernel_seconds_per_step"] == 0.1  # 0.200002 s of kernels: the overlap counts twice
    assert summary["host_blocked_in_sync_seconds_per_step"] == 0.025
    assert summary["per_step_counts"]["kernel_launches"] == 1 and summary["per_step_counts"]["sync_calls"] == 0.5
    assert summary["top_kernels_ms_per_step"] == [["gemm", 100.0], ["copy", 0.0]]
    # --kernels N: the N kernels with the most GPU time
    assert summarize_events(events, steps=2, top=1)["top_kernels_ms_per_step"] == [["gemm", 100.0]]
    # two kernels whose long names agree in their first 120 characters are listed once, with both times
    long_name = "void at::native::elementwise_kernel<128, 2, " + "x" * 100
    twins = [(long_name + "<float>", True, 0, 2_000_000), (long_name + "<bool>", True, 2_000_000, 3_000_000)]
    assert summarize_events(twins, steps=1)["top_kernels_ms_per_step"] == [[long_name[:120], 3.0]]


def test_a_step_profile_says_when_the_host_held_the_steps_and_what_to_pass():
    from bench.profile_steps import host_holds_warning

    assert host_holds_warning(0.136, 0.141, threads=16) is None  # 96 % busy: the GPU holds the step
    warning = host_holds_warning(0.136, 0.197, threads=16)
    assert warning.startswith("The GPU was busy 69% of the profiled steps: the host held them")
    assert warning.endswith(
        "This run used 16 host threads. The train stage runs one: pass --threads 1 --loader-niceness 10."
    )
    assert host_holds_warning(0.136, 0.197, threads=1).endswith("This run used 1 host thread.")


def test_the_profilers_annotations_are_told_apart_from_work():
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.profile_steps import annotation_names

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        with record_function("Optimizer.step#AdamW.step"):
            torch.ones(4).add_(1)
    events = profiler.profiler.kineto_results.events()
    names = annotation_names(events)
    assert names == {"Optimizer.step#AdamW.step"}
    assert any(event.name() == "aten::add_" for event in events)  # the work itself stays


def test_a_trace_reading_names_the_slow_host_ops_and_what_each_wait_was_inside(tmp_path):
    import gzip
    import json

    from bench.trace_ops import read_trace

    def event(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}

    events = [  # microseconds, as torch writes them; one step
        event("aten::index", "cpu_op", 0, 100),
        event("aten::to", "cpu_op", 10, 80),
        event("cudaStreamSynchronize", "cuda_runtime", 20, 60),
        event("aten::nonzero", "cpu_op", 200, 5000),
        event("aten::add", "cpu_op", 7200, 10),
        event("gemm", "kernel", 0, 1000, tid=7),
        event("Optimizer.step", "gpu_user_annotation", 0, 9000, tid=7),  # a label on the GPU row, not work
    ]
    trace = tmp_path / "t.trace.json.gz"
    with gzip.open(trace, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    reading = read_trace(str(trace), steps=1, top=5, pause_ms=1.0, idle_ms=1.0)
    assert reading["gpu_busy_ms_per_step"] == 1.0
    assert reading["host_ops"][0]["name"] == "aten::nonzero" and reading["host_ops"][0]["max_ms"] == 5.0
    assert reading["host_waits"] == [{"inside": ["aten::index", "aten::to"], "per_step": 1.0, "ms_per_step": 0.1}]
    # the thread ran nothing from 5.2 ms to 7.2 ms: one pause, between the nonzero and the next operation
    assert reading["host_pauses"] == {
        "ms_per_step": 2.0,
        "pauses": [{"at_ms": 5.2, "ms": 2.0, "after": "aten::nonzero", "before": "aten::add"}],
    }
    assert reading["gpu_idle"] == {"ms_per_step": 0.0, "stretches": []}  # one kernel: no stretch between work


def test_gpu_time_is_traced_to_the_operations_that_launched_it_on_any_thread():
    from bench.trace_ops import kernel_sources

    def event(name: str, cat: str, ts: float, dur: float, tid: int, correlation: int | None = None) -> dict:
        args = {} if correlation is None else {"correlation": correlation}
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid, "args": args}

    events = [  # two steps; thread 1 runs the forward pass, thread 2 the backward pass
        event("aten::to", "cpu_op", 0, 50, tid=1),
        event("aten::copy_", "cpu_op", 10, 30, tid=1),
        event("cudaLaunchKernel", "cuda_runtime", 20, 5, tid=1, correlation=1),
        event("MulBackward0", "cpu_op", 100, 50, tid=2),
        event("cuLaunchKernel", "cuda_driver", 110, 5, tid=2, correlation=2),  # as Triton launches its kernels
        event("cudaGraphLaunch", "cuda_runtime", 200, 5, tid=1, correlation=3),
        event("direct_copy_kernel", "kernel", 30, 3000, tid=7, correlation=1),
        event("mul_kernel", "kernel", 120, 1000, tid=7, correlation=2),
        event("graphed_gemm", "kernel", 210, 4000, tid=7, correlation=3),
    ]
    sources = kernel_sources(events, steps=2, top=5)
    # with the shapes a trace recorded, each operation is named with its inputs' shapes; --work keeps the copies only
    events[1]["args"]["Input Dims"] = [[128, 384, 24, 24], [128, 384, 24, 24], []]
    assert kernel_sources(events, steps=2, top=5, depth=1, work_name="copy")["by_source"] == [
        {
            "work": "direct_copy_kernel",
            "launched_inside": ["aten::copy_[[128, 384, 24, 24], [128, 384, 24, 24], []]"],
            "per_step": 0.5,
            "ms_per_step": 1.5,
        }
    ]
    # the graph's kernel was launched by no operation: its chain is empty, and it is not counted outside the graphs
    assert sources["outside_cuda_graphs_ms_per_step"] == 2.0
    assert sources["by_source"] == [
        {"work": "graphed_gemm", "launched_inside": [], "per_step": 0.5, "ms_per_step": 2.0},
        {
            "work": "direct_copy_kernel",
            "launched_inside": ["aten::to", "aten::copy_"],
            "per_step": 0.5,
            "ms_per_step": 1.5,
        },
        {"work": "mul_kernel", "launched_inside": ["MulBackward0"], "per_step": 0.5, "ms_per_step": 0.5},
    ]


def test_a_timer_writes_the_timed_runs_as_a_trace_once_when_asked(tmp_path):
    """bench.part_times --trace: the Timer writes a trace of its timed runs (not the warm-up), readable by
    bench.trace_ops, and only for the next piece of work."""
    import torch

    from bench.block_timing import Timer
    from bench.trace_ops import load_events

    timer = Timer(torch.device("cpu"), repeats=3, warmup=2)
    a = torch.randn(8, 8)
    timer.trace = tmp_path / "step.trace.json.gz"
    timer(lambda: a @ a)
    products = [e for e in load_events(str(tmp_path / "step.trace.json.gz")) if e.get("name") == "aten::mm"]
    assert len(products) == 3
    assert all(e["args"]["Input Dims"] == [[8, 8], [8, 8]] for e in products)  # with their inputs' shapes
    assert timer.trace is None


def test_gpu_idle_stretches_name_what_the_host_started_meanwhile():
    from bench.trace_ops import gpu_idle_stretches

    def op(name: str, ts: float) -> dict:
        return {"name": name, "cat": "cpu_op", "ts": ts, "dur": 10}

    gpu = [(0, 1000), (500, 2000), (2500, 3000), (8000, 9000)]  # microseconds; the first two overlap
    host = [op("aten::select", 3100), op("aten::select", 3200), op("aten::copy_", 4000), op("aten::add", 8500)]
    reading = gpu_idle_stretches(gpu, host, steps=1, min_ms=1.0)
    # the 0.5 ms gap at 2.0 ms is left out; the 5 ms one at 3.0 ms is listed with what the host started in it
    assert reading == {
        "ms_per_step": 5.0,
        "stretches": [{"at_ms": 3.0, "ms": 5.0, "host_ops": ["aten::select x2", "aten::copy_ x1"]}],
    }


def test_the_mid_epoch_rate_leaves_out_each_epochs_first_steps():
    from bench.compare import EPOCH_START_STEPS, mid_epoch_images_per_second

    slow_start = [1.0] * EPOCH_START_STEPS  # steps waiting for the loader's first batches
    # 1 + 8 + 10 steps of 128 images: the 10 steps after the start took 0.25 s each, so 512 images/s
    record = {"images": 128 * 19, "step_seconds": slow_start + [0.25] * 10}
    assert mid_epoch_images_per_second([record, record]) == 512.0
    assert mid_epoch_images_per_second([{"images": 128, "step_seconds": []}]) is None  # a CPU run has no GPU clock


def test_cpus_are_halved_by_numa_node_or_by_whole_cores():
    from bench.cpu_halves import Cpu, as_taskset_list, split_cpus, this_machine

    # 4 cores with 2 hyperthreads each, numbered as Linux does (siblings 0/4, 1/5, ...), one NUMA node
    one_node = [Cpu(n, 0, 0, n % 4) for n in range(8)]
    assert split_cpus(one_node) == ([0, 1, 4, 5], [2, 3, 6, 7])
    two_nodes = [Cpu(n, n // 4, n // 4, n % 4) for n in range(8)]
    assert split_cpus(two_nodes) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert as_taskset_list([0, 1, 4, 5, 9]) == "0-1,4-5,9"
    first, second = split_cpus(this_machine())  # this machine's own topology: every CPU in exactly one half
    assert sorted(first + second) == sorted(cpu.number for cpu in this_machine()) and not set(first) & set(second)


def test_the_projection_adds_epochs_at_the_measured_rates_and_each_blocks_fixed_cost():
    from bench.projection import project

    measured = {
        "epoch0_overhead_seconds": 100.0,
        "job_seconds": {"train/block_01": 230.0, "evaluate/evaluate": 50.0},
        "records": [
            {"epoch": 0, "images": 1000, "train_seconds": 110.0, "val_seconds": 30.0},
            {"epoch": 1, "images": 1000, "train_seconds": 10.0, "val_seconds": 10.0},
            {"epoch": 2, "images": 1000, "train_seconds": 10.0, "val_seconds": 10.0},
        ],
    }
    result = project(measured, measured_val_images=100, train_images=2000, val_images=200, epochs=4, epochs_per_block=2)
    inputs = result["inputs"]
    assert inputs["steady_train_images_per_second"] == 100.0 and inputs["validation_seconds_per_image"] == 0.1
    # the job less its three epochs at the steady pace (10 s training + 10 s validation each), whatever else it did
    assert inputs["block_fixed_seconds"] == 170.0 and inputs["blocks"] == 2
    assert result["epoch_seconds"] == 40.0  # 2000 / 100 + 200 x 0.1
    assert result["projected_hours"] == round((4 * 40 + 2 * 170) / 3600, 2)
    assert inputs["seconds_between_epochs"] == "not recorded: counted as 0"  # an epoch log without the field

    # each epoch's checkpoints, between it and the next (EpochLog's since_previous_epoch_seconds), are paid per
    # epoch: a block of 10 pays 10 of them, where the measured block of 3 paid 3 inside its job time
    gaps = [None, 2.0, 2.0]
    saving = {
        **measured,
        "records": [{**r, "since_previous_epoch_seconds": g} for r, g in zip(measured["records"], gaps, strict=True)],
    }
    longer = project(saving, measured_val_images=100, train_images=2000, val_images=200, epochs=20, epochs_per_block=10)
    assert longer["inputs"]["seconds_between_epochs"] == 2.0 and longer["epoch_seconds"] == 42.0
    assert longer["inputs"]["block_fixed_seconds"] == 230 - 3 * (10 + 10 + 2)
    assert longer["projected_hours"] == round((20 * 42 + 2 * 164) / 3600, 2)

    validated = {"validations": [{"images": 200, "seconds": 90.0}, {"images": 200, "seconds": 4.0}]}
    direct = project(measured, 100, 2000, 200, 4, 2, validation=validated)
    assert direct["inputs"]["validation_seconds"] == 4.0 and direct["epoch_seconds"] == 24.0  # 2000 / 100 + 4
    with pytest.raises(ValueError, match="each of 200 images"):
        project(measured, 100, 2000, 200, 4, 2, validation={"validations": [{"images": 500, "seconds": 1.0}] * 2})
    # a real run copies the set to the RAM disk once: the later blocks do without the measured job's copy
    copied = project({**measured, "stage_seconds": 30.0}, 100, 2000, 200, 4, 2)
    assert copied["inputs"]["of_which_stage_copy_seconds"] == 30.0
    assert copied["projected_hours"] == round((4 * 40 + 2 * 170 - 30) / 3600, 2)
    assert project({**measured, "stage_seconds": 30.0}, 100, 2000, 200, 4, 2, stage_seconds=0.0) == result
    with pytest.raises(ValueError, match="no train/block_01 job time"):
        project({**measured, "job_seconds": {}}, 100)


def test_each_epochs_start_is_paid_once_however_many_images_the_epoch_has():
    from bench.compare import EPOCH_START_STEPS
    from bench.projection import project

    # 20 steps of 50 images an epoch: the first steps wait 1 s each for the loader's first batches, the others take
    # 0.5 s (100 images/s mid-epoch); step_seconds spans the steps after the first, which took 1 s too
    steps = [1.0] * EPOCH_START_STEPS + [0.5] * (19 - EPOCH_START_STEPS)
    start = 1.0 + EPOCH_START_STEPS * 1.0 - (EPOCH_START_STEPS + 1) * 0.5  # beyond those steps at 0.5 s each
    train = sum(steps) + 1.0

    def epoch(number: int, extra: float = 0.0) -> dict:
        return {
            "epoch": number,
            "images": 1000,
            "train_seconds": train + extra,
            "val_seconds": 5.0,
            "step_seconds": steps,
        }

    measured = {
        "epoch0_overhead_seconds": 50.0,
        "job_seconds": {"train/block_01": 200.0},
        "records": [epoch(0, 50.0), epoch(1), epoch(2)],
    }
    result = project(
        measured, measured_val_images=100, train_images=10_000, val_images=100, epochs=4, epochs_per_block=2
    )
    inputs = result["inputs"]
    assert inputs["steady_train_images_per_second"] == 100.0 and inputs["epoch_start_seconds"] == start
    assert inputs["train_images_per_second_from"] == "mid-epoch steps"
    # an epoch ten times larger: 10,000 images at 100/s, one start, the validation; not ten times the measured epoch
    assert result["epoch_seconds"] == 10_000 / 100 + start + 5.0
    assert inputs["block_fixed_seconds"] == 200.0 - 3 * (train + 5.0)  # the measured epochs, each with its start
    # records without step times (older runs, the CPU) fall back to whole epochs' rate and say so
    bare = {**measured, "records": [{k: v for k, v in r.items() if k != "step_seconds"} for r in measured["records"]]}
    fallback = project(bare, 100, 10_000, 100, 4, 2)["inputs"]
    assert fallback["epoch_start_seconds"] == "not recorded: counted as 0"
    assert fallback["steady_train_images_per_second"] == round(2000 / (2 * train), 1)


def test_the_cold_start_is_the_cold_runs_fixed_cost_less_the_warm_runs(tmp_path):
    from bench.projection import cold_start_seconds

    def run(job: float, overhead: float, first_validation: float, warmup: float | None = None) -> dict:
        later = [{"epoch": e, "images": 1000, "train_seconds": 10.0, "val_seconds": 5.0} for e in (1, 2)]
        first = {"epoch": 0, "images": 1000, "train_seconds": 10.0 + overhead, "val_seconds": first_validation}
        jobs = {"train/block_01": job, **({"train/compile_warmup": warmup} if warmup else {})}
        return {"epoch0_overhead_seconds": overhead, "job_seconds": jobs, "records": [first, *later]}

    cold, warm = run(400.0, 180.0, 110.0, warmup=230.0), run(120.0, 20.0, 15.0)
    assert cold_start_seconds(cold, warm, 100) == (400 - 45) - (120 - 45)  # 3 epochs at 10 + 5 s each
    # a cold run of one epoch, at the warm run's pace
    one_epoch = {**cold, "records": cold["records"][:1], "job_seconds": {"train/block_01": 370.0}}
    assert cold_start_seconds(one_epoch, warm, 100) == (370 - 15) - (120 - 45)
    # the command: the same cold start as the arithmetic, shown among the inputs with the cold run's warm-up
    (tmp_path / "cold.json").write_text(json.dumps({"a": cold}))
    (tmp_path / "warm.json").write_text(json.dumps({"b": warm}))
    common = [sys.executable, "-m", "bench.projection", str(tmp_path / "warm.json"), "--run", "b"]
    printed = subprocess.run(
        [*common, "--measured-val-images", "100", "--cold", str(tmp_path / "cold.json"), "--cold-run", "a"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    inputs = json.loads(printed.stdout)["inputs"]
    assert inputs["cold_start_seconds"] == 280.0 and inputs["cold_run_compile_warmup_seconds"] == 230.0
    refused = subprocess.run(
        [*common, "--measured-val-images", "100", "--cold", str(tmp_path / "cold.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "--cold needs --cold-run" in refused.stderr


def notebook_run() -> dict:
    """bench.compare's stock run of three epochs: 1,000 images each, the later ones in 20 s and validated in 4 s."""
    later = [{"epoch": e, "images": 1000, "train_seconds": 20.0, "val_seconds": 4.0} for e in (1, 2)]
    first = {"epoch": 0, "images": 1000, "train_seconds": 140.0, "val_seconds": 104.0}
    return {"wall_seconds": 400.0, "epoch0_overhead_seconds": 120.0, "records": [first, *later]}


def test_the_notebook_is_projected_as_one_process_that_pays_its_fixed_cost_once(tmp_path):
    from bench.projection import project

    stock = notebook_run()
    result = project(stock, measured_val_images=100, train_images=2000, val_images=200, epochs=40)
    inputs = result["inputs"]
    # one process: 400 s less its three epochs at 20 + 4 s each, counted once, whatever epochs_per_block says
    assert inputs["blocks"] == 1 and inputs["block_fixed_seconds"] == 328.0
    assert inputs["measured_job"] == "the notebook's process" and inputs["measured_job_seconds"] == 400.0
    assert result["epoch_seconds"] == 48.0  # 2000 / 50 + 200 x 0.04
    assert result["projected_hours"] == round((40 * 48 + 328) / 3600, 2)
    # the command reads bench.compare's summary, where the stock run sits beside the workflow's
    (tmp_path / "summary.json").write_text(json.dumps({"stock": stock}))
    command = [sys.executable, "-m", "bench.projection", str(tmp_path / "summary.json"), "--run", "stock"]
    printed = subprocess.run(
        [*command, "--measured-val-images", "100", "--train-images", "2000", "--val-images", "200"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(printed.stdout)["projected_hours"] == result["projected_hours"]


def test_a_validation_of_cocos_size_comes_from_bench_validation_or_an_epoch_log(tmp_path):
    from bench.projection import project, read_validation

    stock = notebook_run()
    # the notebook's EpochLog of a run on a set of 5,000 validation images: its first validation compiles
    epochs = tmp_path / "epochs.jsonl"
    epochs.write_text("".join(json.dumps({"epoch": e, "val_seconds": s}) + "\n" for e, s in enumerate([130, 15, 14])))
    validation = read_validation(epochs)
    result = project(stock, measured_val_images=100, train_images=2000, val_images=5000, validation=validation)
    assert result["inputs"]["validation_seconds"] == 14.5 and result["inputs"]["validation_from"] == "epochs.jsonl"
    assert result["epoch_seconds"] == 2000 / 50 + 14.5
    # bench.validation's output counts its images, and a set of another size is refused
    measured = tmp_path / "validation.json"
    measured.write_text(json.dumps({"validations": [{"images": 500, "seconds": s} for s in (9.0, 1.0, 2.0)]}))
    with pytest.raises(ValueError, match="each of 5000 images"):
        project(stock, 100, 2000, 5000, validation=read_validation(measured))
    assert project(stock, 100, 2000, 500, validation=read_validation(measured))["inputs"]["validation_seconds"] == 1.5


@pytest.mark.parametrize(("detail", "low_kb", "high_kb"), [("photo", 55, 90), ("coco", 135, 190)])
def test_the_synthetic_set_has_the_byte_size_its_detail_promises(tmp_path, detail, low_kb, high_kb):
    from bench.synth_coco import main

    main([str(tmp_path), "48", "2", "--detail", detail, "--workers", "2"])
    files = list((tmp_path / "train2017").glob("*.jpg"))
    mean_kb = sum(f.stat().st_size for f in files) / len(files) / 1000
    assert len(files) == 48
    assert low_kb < mean_kb < high_kb, f"{detail}: {mean_kb:.1f} kB an image on average"


def test_a_set_with_fewer_distinct_train_images_lists_every_image_and_links_the_rest(tmp_path):
    import json

    from bench.synth_coco import main

    main([str(tmp_path), "10", "2", "--distinct-train", "4", "--workers", "2"])
    listing = json.loads((tmp_path / "annotations" / "instances_train2017.json").read_text())
    files = {image["file_name"]: tmp_path / "train2017" / image["file_name"] for image in listing["images"]}
    assert len(listing["images"]) == 10 and len({image["id"] for image in listing["images"]}) == 10
    assert all(path.is_file() for path in files.values())
    assert len({path.stat().st_ino for path in files.values()}) == 4  # 4 drawn, 6 hard links to them
    assert len({annotation["id"] for annotation in listing["annotations"]}) == len(listing["annotations"])
    # a linked image carries the boxes of the image it links to
    boxes = {}
    for annotation in listing["annotations"]:
        boxes.setdefault(annotation["image_id"], []).append(annotation["bbox"])
    first, fifth = (image["id"] for image in listing["images"][0:5:4])
    assert boxes[first] == boxes[fifth]


def test_a_validation_timed_whole_keeps_its_phases_at_zero_and_counts_its_images():
    from bench.validation import PHASES, PhaseRecord

    for phases in (True, False):
        record = PhaseRecord(phases=phases)
        record.start(epoch=0)
        record.current["images"] = 250
        for phase in ("loader", "forward", "batch_callbacks", "epoch_end"):
            record.close(phase)
        record.finish()
        (done,) = record.records
        assert done["images"] == 250 and done["seconds"] >= 0
        if not phases:  # no clock between start and end: every phase stays 0
            assert all(done[phase] == 0.0 for phase in PHASES)
        else:  # the phases add up to the whole (each is rounded to the millisecond)
            assert abs(sum(done[phase] for phase in PHASES) - done["seconds"]) <= 0.005


def marked_model(val_batch: int):
    """A small Lightning model (8 training and 6 validation items of 4 numbers) whose steps are marked in a
    torch.profiler trace: `training_step_marker`, `validation_of_epoch_<epoch>`."""
    import pytorch_lightning as pl
    import torch

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            with torch.profiler.record_function("training_step_marker"):
                return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx) -> None:
            with torch.profiler.record_function(f"validation_of_epoch_{self.current_epoch}"):
                self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 4)), batch_size=4)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(6, 4)), batch_size=val_batch)

    return Model()


def test_the_phase_clocks_record_each_validation_with_its_images_and_phases(tmp_path):
    """`bench.validation`'s clocks, first and last in the callback list around a callback that works at each
    validation batch's end: one record per validation, its images and batches counted, that work in its phase."""
    import pytorch_lightning as pl

    from bench.validation import PHASES, PhaseClockFirst, PhaseClockLast, PhaseRecord
    from tests.helpers.lightning_trainer import small_trainer

    class BatchWork(pl.Callback):  # stands for the metric's work at each batch's end
        def on_validation_batch_end(self, *args) -> None:
            sum(range(200_000))

    record = PhaseRecord()
    small_trainer(tmp_path, [PhaseClockFirst(record), BatchWork(), PhaseClockLast(record)], 2).fit(
        marked_model(val_batch=4)
    )
    assert [done["epoch"] for done in record.records] == [0, 1]
    for done in record.records:
        assert done["images"] == 6 and done["batches"] == 2  # a batch of 4 and the last one of 2
        assert done["batch_callbacks"] > 0
        assert abs(sum(done[phase] for phase in PHASES) - done["seconds"]) <= 0.006


def test_the_validation_profiler_traces_only_the_second_validation(tmp_path):
    """`bench.validation --trace`: the trace holds the operations of one validation, the second, and none of the
    training steps or of the other validations."""
    import gzip

    from bench.validation import ProfileOneValidation
    from tests.helpers.lightning_trainer import small_trainer

    trace = tmp_path / "validation.trace.json.gz"
    small_trainer(tmp_path, [ProfileOneValidation(trace)], 3).fit(marked_model(val_batch=2))
    with gzip.open(trace, "rt") as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert "validation_of_epoch_1" in names
    assert not names & {"validation_of_epoch_0", "validation_of_epoch_2", "training_step_marker"}


def test_the_validation_loader_pass_delivers_every_validation_image_as_the_train_stage_sends_them(
    tiny_dataset, monkeypatch, capsys
):
    from bench.loader import main

    passes = {}
    for as_bytes in (False, True):
        args = ["bench.loader", "--dataset", str(tiny_dataset), "--split", "val", "--workers", "0", "--batch", "3"]
        monkeypatch.setattr(sys, "argv", args + (["--images-as-bytes"] if as_bytes else []))
        main()
        passes[as_bytes] = json.loads(capsys.readouterr().out)  # stdout is the result alone: `> FILE.json` works
    val_images = len(json.loads((tiny_dataset / "annotations" / "instances_val2017.json").read_text())["images"])
    for result in passes.values():
        # every image once, in batches of 3 (the last one smaller), from a fresh loader
        assert result["split"] == "val" and result["images"] == val_images == 4 and result["batch"] == 3
        assert 0 <= result["first_batch_seconds"] <= result["seconds"] and result["seconds"] > 0
        # the rate is the images over the whole pass (seconds are printed rounded to 1 ms)
        assert result["images_per_second"] == pytest.approx(val_images / result["seconds"], rel=0.1)
    # what crossed from the workers: uint8 as the train stage sends validation images, float32 as rfdetr does
    assert passes[True]["image_dtype"] == "torch.uint8" and passes[False]["image_dtype"] == "torch.float32"


def test_the_loaders_tensor_resize_builds_the_training_set_inside_the_resize_in_torch_speedup(tiny_dataset):
    """bench.loader --tensor-resize times the registry's speedup (tests/test_resize_in_torch.py shows its pixels),
    and leaves rfdetr's pipeline in place afterwards."""
    from torchvision.transforms.v2 import ToImage

    from bench.loader import training_data

    first = {
        tensors: training_data(str(tiny_dataset), 2, 0, tensors)._dataset_train._transforms.transforms[0]
        for tensors in (True, False)
    }
    assert isinstance(first[True], ToImage) and not isinstance(first[False], ToImage)


def test_speedups_as_the_bench_tools_take_them_start_from_those_that_keep_rfdetrs_values():
    from bench.profile_steps import parse_speedups
    from rfdetr_coco_pipeline.hooks import BY_DEFAULT, NAMES

    assert parse_speedups("all") == "all" and parse_speedups("gc_freeze,resize_in_torch") == [
        "gc_freeze",
        "resize_in_torch",
    ]
    assert parse_speedups("all,-gc_freeze") == [name for name in BY_DEFAULT if name != "gc_freeze"]
    with_resize = parse_speedups("all,-gc_freeze,+resize_in_torch")
    assert set(with_resize) == set(BY_DEFAULT) - {"gc_freeze"} | {"resize_in_torch"}
    assert with_resize == [name for name in NAMES if name in with_resize]  # in the registry's order
    for wrong in ("all,-fastest", "all,gc_freeze"):
        with pytest.raises(ValueError, match="not speedups"):
            parse_speedups(wrong)


def test_a_profile_records_the_inductor_settings_its_environment_set():
    from bench.profile_steps import inductor_environment

    environ = {"TORCHINDUCTOR_ENABLE_PDL": "1", "PATH": "/bin", "TORCHINDUCTOR_CACHE_DIR": "/tmp/c", "TORCH_LOGS": "x"}
    assert inductor_environment(environ) == {"TORCHINDUCTOR_CACHE_DIR": "/tmp/c", "TORCHINDUCTOR_ENABLE_PDL": "1"}
    assert inductor_environment({"PATH": "/bin"}) == {}


def test_the_flop_count_is_per_image_splits_the_forward_by_part_and_gives_the_rates_utilisation(tmp_path):
    """bench.flops on the real Nano training module (64 px keeps it quick): the count per image does not depend on
    how many images were counted, the backward is about twice the forward, the parts hold the forward, and the
    utilisation is the rate's FLOPs over the peak."""
    from bench.flops import report

    one, two = report(64, 1, None, 989.0), report(64, 2, 100.0, 500.0)
    assert one["gflop_per_training_image"] == pytest.approx(two["gflop_per_training_image"], rel=0.01)
    assert 2.5 < two["gflop_per_training_image"] / two["forward_gflop_per_image"] < 3.5
    parts = two["forward_gflop_per_image_by_part"]
    assert sum(parts.values()) == pytest.approx(two["forward_gflop_per_image"], abs=0.01)
    assert parts["other"] < 0.01 * two["forward_gflop_per_image"]  # every module of the forward has its part
    assert two["utilisation"] == pytest.approx(two["gflop_per_training_image"] * 100 / 1000 / 500.0, rel=0.01)


def test_the_part_times_cover_every_part_of_a_real_step_and_each_rest_is_what_its_rows_leave(tmp_path):
    """bench.part_times on the real Nano training module (64 px, one image, as written): every part's row and
    each "rest of" row are there, a call the decoder makes of a head counts under the transformer, not twice, and
    the record saved is the one printed."""
    from bench.part_times import PARTS, inductor_setting, part_of

    # the box head called by the decoder (for its reference points) belongs to the transformer's time
    assert part_of("bbox_embed", ("transformer",)) == []
    assert part_of("bbox_embed", ()) == ["class and box heads"]
    # the capture leaves rfdetr's batched two-stage pass on (it steps aside for hooked heads): the step timed is the
    # step trained
    from bench.flops import training_module
    from bench.part_times import captured_calls

    model = training_module(64, 1).model
    with captured_calls(model):
        assert model.transformer._two_stage_batching_eligible()
    out = tmp_path / "parts.json"
    command = [sys.executable, "-m", "bench.part_times", "--resolution", "64", "--batch", "1", "--repeats", "1"]
    # with decoder_attention_on_views the decoder's self-attention runs inside its layer, not as a module
    command += ["--warmup", "0", "--no-compile", "--speedups", "decoder_attention_on_views", "--out", str(out)]
    command += ["--inductor", "combo_kernels=True"]
    printed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.read_text())
    assert result["inductor"] == {"combo_kernels": True}
    with pytest.raises(argparse.ArgumentTypeError, match="'no_such_setting=1': expected KEY=VALUE"):
        inductor_setting("no_such_setting=1")  # --inductor's type: argparse stops with its message
    rows = {row["part"]: row for row in result["rows"]}
    inside_its_parent = "decoder self-attention"
    assert result["parts_not_called"] == [inside_its_parent] and inside_its_parent not in rows
    assert f"{inside_its_parent}: not called as a module" in printed
    called = [part for part in PARTS if part.label != inside_its_parent]
    assert {part.label for part in called} | {"loss (matching, criterion)", "optimizer (AdamW step)"} <= set(rows)
    assert all(rows[part.label]["ms"] > 0 for part in called)
    parent_of_missing = next(part.parent for part in PARTS if part.label == inside_its_parent)
    assert f"rest of {parent_of_missing}" not in rows  # its rest would hold the self-attention: no row
    for parent in {part.parent for part in called} - {None, parent_of_missing}:
        inner = sum(rows[part.label]["ms"] for part in PARTS if part.parent == parent)
        assert rows[f"rest of {parent}"]["ms"] == pytest.approx(rows[parent]["ms"] - inner, abs=0.02)
    top = [row for row in result["rows"] if row["within"] is None]
    assert sum(row["share_of_parts_sum"] for row in top) == pytest.approx(1.0, abs=0.001)
    assert result["whole_step_ms"] > 0 and result["measure"] == "wall ms per step"
    for row in result["rows"]:
        assert f"{row['ms']:9.2f}" in printed and row["part"] in printed


def test_the_part_times_record_of_the_whole_step_alone_has_no_parts_sum():
    """`--only "^whole step"` times no part: the record says so (None), not a sum it did not measure."""
    import torch

    from bench.part_times import table

    record = table({}, 76.9, 384, 64, torch.device("cpu"), True)
    assert record["rows"] == [] and record["parts_sum_ms"] is None and record["whole_step_ms"] == 76.9
    assert table({"projector": 2.0}, None, 384, 64, torch.device("cpu"), True)["parts_sum_ms"] == 2.0


def test_the_decoder_self_attention_variants_give_rfdetrs_values_and_gradients():
    """bench.decoder_self_attention against rfdetr's own decoder layer (real Nano, 64 px, training mode, float32):
    its copy of rfdetr's block gives what the layer's attention gave, the layer with `GroupedSelfAttention` swapped
    in (the lean path taken, not nn.MultiheadAttention's) gives the layer's output and gradients, and the grouped
    views give the block's."""
    from unittest.mock import patch

    import torch
    from torch import nn

    from bench.block_timing import detached
    from bench.decoder_self_attention import GroupedSelfAttention, grouped_views_block, measure, rfdetr_block
    from bench.flops import synthetic_batch, training_module
    from bench.part_times import captured_calls

    module = training_module(64, 2)
    samples, targets = synthetic_batch(2, 64)
    with captured_calls(module.model) as calls:
        module.model(samples, targets)
    call = next(c for c in calls if c.path == "transformer.decoder.layers.0")
    layer, tgt, query_pos = call.module, call.args[0], call.kwargs["query_pos"]
    grad = torch.randn(tgt.shape, generator=torch.Generator().manual_seed(1))

    def layer_run() -> list:
        args, kwargs = detached(call.args), detached(call.kwargs)
        args[0].requires_grad_(True)
        out = layer(*args, **kwargs)
        out.backward(grad)
        grads = [args[0].grad, *(p.grad.clone() for p in layer.self_attn.parameters())]
        layer.zero_grad(set_to_none=True)
        return [out.detach(), *grads]

    attended = []
    handle = layer.self_attn.register_forward_hook(lambda m, i, o: attended.append(o[0].detach()))
    expected = layer_run()
    handle.remove()
    assert torch.allclose(rfdetr_block(layer.self_attn, tgt, query_pos), torch.cat(attended[0].split(2, 0), 1))
    layer.self_attn.__class__ = GroupedSelfAttention
    try:
        with patch.object(nn.MultiheadAttention, "forward", side_effect=AssertionError("fell back")):
            lean = layer_run()
    finally:
        layer.self_attn.__class__ = nn.MultiheadAttention
    for want, got in zip(expected, lean, strict=True):
        # float32 rounding of sums over many terms, bounded by the tensor's scale (the gradients reach a few hundred)
        assert (want - got).abs().max() <= 1e-6 * want.abs().max() + 1e-5

    inputs = [tgt.detach().clone().requires_grad_(True), query_pos.detach().clone().requires_grad_(True)]
    results = []
    for block in (rfdetr_block, grouped_views_block):
        out = block(layer.self_attn, *inputs)
        out.backward(grad)
        results.append([out.detach(), *(t.grad.clone() for t in inputs), layer.self_attn.in_proj_weight.grad.clone()])
        for t in [*inputs, *layer.self_attn.parameters()]:
            t.grad = None
    for want, got in zip(*results, strict=True):
        assert torch.allclose(want, got, rtol=1e-4, atol=1e-5)
    timed = measure(1, 1, 0, compile_blocks=False)
    assert set(timed["ms_per_step"]) == {"rfdetr", "lean_module", "grouped_views"}


def test_the_decoder_ffn_with_the_relu_in_the_products_epilogue_gives_rfdetrs_values_and_gradients():
    """bench.decoder_ffn against rfdetr's own decoder layer (real Nano, 64 px, training mode, float32): its copy of
    rfdetr's feed-forward block gives what the layer's norm3 gave, and the blocks through `LinearReLU` (the bias's
    gradient from the weight's product) and through `BiasGradientSummed` give the same values and gradients (of the
    queries and of every parameter)."""
    import torch

    from bench.block_timing import detached
    from bench.decoder_ffn import BLOCKS, measure, rfdetr_block
    from bench.flops import synthetic_batch, training_module
    from bench.part_times import captured_calls

    module = training_module(64, 2)
    samples, targets = synthetic_batch(2, 64)
    with captured_calls(module.model) as calls:
        module.model(samples, targets)
    call = next(c for c in calls if c.path == "transformer.decoder.layers.1")
    layer = call.module
    seen = {}
    handles = [
        getattr(layer, name).register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, o.detach()))
        for name in ("norm2", "norm3")
    ]
    layer(*detached(call.args), **detached(call.kwargs))
    for handle in handles:
        handle.remove()
    assert torch.allclose(rfdetr_block(layer, seen["norm2"]), seen["norm3"], atol=1e-6)

    grad = torch.randn(seen["norm2"].shape, generator=torch.Generator().manual_seed(2))
    results = []
    for block in BLOCKS.values():
        tgt = seen["norm2"].clone().requires_grad_(True)
        out = block(layer, tgt)
        out.backward(grad)
        params = [layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.norm3.weight]
        results.append([out.detach(), tgt.grad, *(p.grad.clone() for p in params)])
        layer.zero_grad(set_to_none=True)
    assert len(results) == 3
    for other in results[1:]:
        for want, got in zip(results[0], other, strict=True):
            assert torch.allclose(want, got, rtol=1e-4, atol=1e-5)
    assert set(measure(1, 1, 0, compile_blocks=False)["ms_per_step"]) == set(BLOCKS)


def test_the_backbone_attention_with_one_projection_gives_rfdetrs_values_and_gradients():
    """bench.backbone_attention against the attention module of a real Nano's backbone block (64 px, training mode,
    float32): the fused-projection block gives the module's output and the gradients of its input and of every
    parameter, at the windowed and the whole-image shapes; its own module has Nano's sizes."""
    import torch

    from bench.backbone_attention import HEADS, WIDTH, fused_qkv_block, measure, nano_attention, rfdetr_block
    from bench.flops import training_module

    model = training_module(64, 2).model
    attention = model.get_submodule("backbone.0.encoder.encoder.encoder.layer.0.attention")
    assert (attention.attention.num_attention_heads, attention.output.dense.in_features) == (HEADS, WIDTH)
    generator = torch.Generator().manual_seed(3)
    for shape in ((8, 5, WIDTH), (2, 20, WIDTH)):
        results = []
        for block in (rfdetr_block, fused_qkv_block):
            hidden = torch.randn(shape, generator=torch.Generator().manual_seed(4)).requires_grad_(True)
            out = block(attention, hidden)
            out.backward(torch.randn(out.shape, generator=generator.manual_seed(5)))
            results.append([out.detach(), hidden.grad, *(p.grad.clone() for p in attention.parameters())])
            attention.zero_grad(set_to_none=True)
        for want, got in zip(*results, strict=True):
            assert torch.allclose(want, got, rtol=1e-4, atol=1e-5)
    own = nano_attention()
    assert own.attention.query.weight.shape == attention.attention.query.weight.shape
    timed = measure(1, 1, 0, compile_blocks=False)
    assert set(timed["ms_per_step"]) == {"rfdetr", "fused_qkv"}
    assert set(timed["by_shape"]) == {"windowed", "whole_image"}


def test_the_written_out_attention_gives_sdpas_values_and_gradients_and_is_timed_beside_the_backends():
    """bench.attention_backends' written-out attention (two products around a float32 softmax) against SDPA's math
    backend at a backbone window's shape: the same output and gradients of q, k and v in float32, within bf16
    rounding in bf16; on the CPU the tool times it and reports a backend that cannot run as an error, not a time."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.attention_backends import time_backend, written_out_attention

    torch.manual_seed(0)
    shape = (2, 3, 145, 64)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(shape, dtype=dtype)
        with sdpa_kernel(SDPBackend.MATH):
            expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        expected_grads = torch.autograd.grad(expected, (q, k, v), grad.float())
        out = written_out_attention(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), grad)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got.float(), want.float(), atol=5 * tolerance, rtol=5 * tolerance)

    record = time_backend("WRITTEN_OUT", shape, repeats=2, device="cpu", compiled=False)
    assert record["forward_ms"] > 0 and record["backward_ms"] > 0
    assert record["max_abs_difference_to_math"] < 2e-2
    refused = time_backend(SDPBackend.CUDNN_ATTENTION, shape, repeats=2, device="cpu")
    assert set(refused) == {"error"} and "backend" in refused["error"]


def test_the_product_kernel_configurations_are_each_timed_and_give_the_shipped_ones_product(tmp_path):
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels; without it the kernel never runs")
    from rfdetr_coco_pipeline.hooks.patches import feed_forward_products as products

    out = tmp_path / "configurations.json"
    # 70 rows, K = 40, 50 columns: partial tiles in every dimension; float32, as the interpreter's bf16 dot is wrong
    command = [sys.executable, "-m", "bench.product_kernel_configs", "--rows", "70", "--inner", "40"]
    command += "--columns 50 --tiles 32x32x16,16x64x32 --warps 4 --stages 2 --saved-first 0,1".split()
    command += ["--dtype", "float32", "--out", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    printed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.read_text())
    assert (result["rows"], result["inner"], result["columns"], result["dtype"]) == (70, 40, 50, "float32")
    tiles = sorted((c["block_m"], c["block_n"], c["block_k"], c["saved_first"]) for c in result["configurations"])
    assert tiles == [(16, 64, 32, False), (16, 64, 32, True), (32, 32, 16, False), (32, 32, 16, True)]
    for c in result["configurations"]:
        assert c["us"] > 0 and c["apart"] < 1e-5  # other sums of the same float32 terms
        assert c["tflops"] == pytest.approx(2 * 70 * 40 * 50 / c["us"] / 1e6, abs=0.05)
    assert result["replaced_us"] > 0
    shipped = (products.TILE_M, products.TILE_N, products.TILE_K, products.WARPS, products.STAGES)
    assert tuple(result["shipped"].values()) == (*shipped, products.SAVED_FIRST)
    assert printed.count(" us  ") == 4 and printed.count(" saved first ") == 2
    assert printed.count("cuBLAS and the mask's pass") == 1


def test_the_norm_kernel_configurations_are_each_timed_and_give_the_shipped_ones_gradients(tmp_path):
    pytest.importorskip("triton", reason="Triton comes with torch's Linux wheels; without it the kernel never runs")
    from rfdetr_coco_pipeline.hooks.patches import backbone_norm_backward_in_one_pass as lever

    out = tmp_path / "configurations.json"
    # 37 rows of 24 channels: tiles of 1 and 4 rows, the last tile of 4 partly empty, the row masked in a block of 32
    command = [sys.executable, "-m", "bench.norm_kernel_configs", "--rows", "37", "--channels", "24"]
    command += ["--tiles", "1,4", "--warps", "2,4", "--per-multiprocessor", "1", "--out", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    printed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    record = json.loads(out.read_text())
    configurations = record["configurations"]
    assert sorted((c["tile"], c["warps"]) for c in configurations) == [(1, 2), (1, 4), (4, 2), (4, 4)]
    assert all(c["us"] > 0 for c in configurations)
    for c in configurations:
        assert c["gb_per_s"] == pytest.approx(record["bytes_moved"] / c["us"] / 1e3, abs=0.05)
    assert record["bytes_moved"] == 37 * 24 * (2 + 4 + 4 + 2 + 4 + 2)  # read grad_z, grad_h, h, a; write grad_x, grad_a
    # other sums of the same terms: float32 gradients agree to rounding, a bf16 one at most one bf16 step apart
    assert all(c["apart"] < 2**-7 for c in configurations)
    assert record["shipped"] == {
        "tile": lever.TILE,
        "warps": lever.WARPS,
        "programs_per_multiprocessor": lever.PROGRAMS_PER_MULTIPROCESSOR,
    }
    assert printed.count(" us ") == 4


def test_gradient_copies_at_a_compiled_boundary_are_counted_and_maps_as_slices_of_one_buffer_make_none():
    """bench.gradient_copies on two compiled graphs, like rfdetr's backbone (four maps) and projector (the maps
    joined along the channels for a channels-last convolution): rfdetr's contiguous maps get their gradients as
    channel slices, each copied before the first graph's backward; the maps of backbone_maps_in_one_buffer, channel
    slices of one buffer, get none, and the gradients are the same. AOTAutograd makes the copies whatever backend
    runs its graphs: `aot_eager` runs them without waiting for Inductor to compile them."""
    import torch

    from bench.gradient_copies import counting_gradient_copies
    from rfdetr_coco_pipeline.hooks.patches.backbone_maps_in_one_buffer import maps_as_slices

    batch, rows, width = 2, 4, 8
    torch.manual_seed(0)
    linear, convolution = torch.nn.Linear(width, width), torch.nn.Conv2d(4 * width, width, 1)

    def grids(tokens):
        return [(linear(tokens) * (i + 1)).reshape(batch, rows, rows, width) for i in range(4)]

    def rfdetrs_maps(tokens):
        return [grid.permute(0, 3, 1, 2).contiguous() for grid in grids(tokens)]

    def projector(maps):
        joined = torch.cat(maps, dim=1).contiguous(memory_format=torch.channels_last)
        return convolution(joined).square().sum()

    tokens = torch.randn(batch * rows * rows, width)
    counts, gradients = {}, {}
    for name, maps in (("rfdetr", rfdetrs_maps), ("one buffer", lambda t: maps_as_slices(grids(t)))):
        backbone, joined = torch.compile(maps, backend="aot_eager"), torch.compile(projector, backend="aot_eager")
        for _ in range(2):  # the first step compiles
            linear.zero_grad()
            with counting_gradient_copies() as copies:
                joined(backbone(tokens)).backward()
        counts[name], gradients[name] = copies, linear.weight.grad.clone()
    slice_of_channels_last = (rows * rows * 4 * width, 1, rows * 4 * width, 4 * width)
    contiguous = (width * rows * rows, rows * rows, rows, 1)
    assert counts["rfdetr"] == {((batch, width, rows, rows), slice_of_channels_last, contiguous, "float32"): 4}
    assert counts["one buffer"] == {}
    assert torch.allclose(gradients["one buffer"], gradients["rfdetr"], rtol=1e-5, atol=1e-6)
