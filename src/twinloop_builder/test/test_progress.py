"""A build's overall progress and time left from the stages' own fractions (no ROS)."""
from __future__ import annotations

import pytest

from twinloop_builder.progress import STAGE_WEIGHTS, BuildProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overall_fraction_weighs_the_planned_stages_and_the_eta_follows_the_rate():
    clock = Clock()
    tracker = BuildProgress(clock)
    tracker.plan(("reading", "arm_delay", "arm", "held_out", "writing", "done"))
    total = sum(STAGE_WEIGHTS[s] for s in ("reading", "arm_delay", "arm", "held_out", "writing"))
    first = tracker.update("reading", 0.0)
    assert (first.fraction, first.elapsed_s, first.eta_s) == (0.0, 0.0, None)
    clock.now += 30.0
    half_arm = tracker.update("arm", 0.5)
    expected = (STAGE_WEIGHTS["reading"] + STAGE_WEIGHTS["arm_delay"] + 0.5 * STAGE_WEIGHTS["arm"]) / total
    assert half_arm.fraction == pytest.approx(expected)
    assert half_arm.eta_s == pytest.approx(30.0 * (1 - expected) / expected)
    assert "overall, ETA" in half_arm.describe() and f"{expected * 100:5.1f} %" in half_arm.describe()
    # a stage reporting a lower fraction (the arm stage restarts its count) never moves it back
    clock.now += 1.0
    assert tracker.update("arm", 0.1).fraction == pytest.approx(expected)
    # a stage outside the plan adds nothing; held_out then continues from the end of arm
    assert tracker.update("box", 0.9).fraction == pytest.approx((total - STAGE_WEIGHTS["held_out"]
                                                                 - STAGE_WEIGHTS["writing"]) / total)
    assert tracker.update("writing", 0.0).fraction == pytest.approx((total - STAGE_WEIGHTS["writing"]) / total)
    assert tracker.update("writing", 1.0).fraction == 0.999  # 100 % only once done
    done = tracker.update("done", 1.0)
    assert (done.fraction, done.eta_s) == (1.0, 0.0) and done.describe().startswith("100.0 % overall, ETA 0 s")


def test_without_a_plan_every_stage_counts_and_a_bad_plan_is_refused():
    tracker = BuildProgress(Clock())
    all_weights = sum(STAGE_WEIGHTS.values())
    assert tracker.update("box", 0.0).fraction == pytest.approx(
        sum(STAGE_WEIGHTS[s] for s in ("reading", "arm_delay", "arm")) / all_weights)
    with pytest.raises(ValueError, match="unknown build stage"):
        tracker.plan(["reading", "polishing"])
