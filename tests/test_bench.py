"""The benchmark comparison that BENCHMARKS.md is built from: ratios against the stock run, and loss curves
compared image for image when the batch differs."""

from __future__ import annotations

import pytest

from bench.side_by_side import loss_difference, on_the_same_images, side_by_side


def run(images_per_second: float, losses: list[float], batch: int) -> dict:
    return {
        "steady_images_per_second": images_per_second,
        "epoch0_overhead_seconds": 10.0,
        "first_validation_seconds": 5.0,
        "peak_memory_gb": 1.0,
        "records": [{"epoch": 0, "images": batch * len(losses), "loss": losses}],
    }


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


def test_without_a_stock_run_it_says_what_to_run_first():
    with pytest.raises(SystemExit, match="bench.compare --only stock"):
        side_by_side({"call": {"lever": run(400.0, [1.0], batch=128)}})
