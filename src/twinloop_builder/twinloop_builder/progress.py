"""A build's progress as one figure: the stages' own fractions weighted into an overall
fraction, and the time left at the rate so far. Pure Python.

The stages report `progress(stage, fraction_of_that_stage, message)`; which stages run
depends on the data (no pushes: no `box` stage; no held-out bags: no `held_out`), so the
build names them once it has read the bags (`plan`), and their weights are renormalized
over what runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

STAGES = ("reading", "arm_delay", "arm", "box", "held_out", "residual", "writing", "done")
# Share of a build's time per stage; only the ratios matter. Measured on a 5 s fit and a 3 s
# held-out recording, every parameter (87 s): reading 0.6 s, arm_delay 42 s, arm 44 s,
# held_out 0.3 s, writing 0.1 s. `box` is a guess (no push build was timed). `residual`: 1-2 s
# of validation replays when the twin has no systematic error, ~25 s when a residual trains.
STAGE_WEIGHTS = {"reading": 0.01, "arm_delay": 0.47, "arm": 0.50, "box": 0.30, "held_out": 0.01, "residual": 0.05,
                 "writing": 0.01, "done": 0.0}
MIN_FRACTION_FOR_ETA = 0.03  # below it the rate so far says little
MAX_BEFORE_DONE = 0.999


@dataclass(frozen=True)
class Overall:
    fraction: float       # 0..1 of the whole build
    elapsed_s: float
    eta_s: float | None   # time left at the rate so far; None until there is a rate

    def describe(self) -> str:
        eta = "ETA --" if self.eta_s is None else f"ETA {_duration(self.eta_s)}"
        return f"{self.fraction * 100:5.1f} % overall, {eta}"


class BuildProgress:
    """Turns per-stage progress into overall progress.

        tracker = BuildProgress()
        tracker.plan(["reading", "arm_delay", "arm", "held_out", "writing", "done"])
        overall = tracker.update("arm", 0.5)   # -> Overall(fraction=..., eta_s=...)

    Before `plan` every stage of STAGES counts. A stage outside the plan counts nothing;
    a planned stage that never reports is passed over. The fraction never goes back.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._weights = dict(STAGE_WEIGHTS)
        self._fraction = 0.0

    def plan(self, stages: Sequence[str]) -> None:
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown build stage(s) {unknown}; stages are {list(STAGES)}")
        self._weights = {stage: STAGE_WEIGHTS[stage] if stage in stages else 0.0 for stage in STAGES}

    def update(self, stage: str, fraction: float) -> Overall:
        total = sum(self._weights.values())
        if stage in STAGES and total > 0:
            before = sum(self._weights[s] for s in STAGES[:STAGES.index(stage)])
            within = min(1.0, max(0.0, fraction)) * self._weights[stage]
            # 100 % is said by `done` alone (writing reports 0.97 of itself as it starts)
            self._fraction = max(self._fraction, min(MAX_BEFORE_DONE, (before + within) / total))
        if stage == "done":
            self._fraction = 1.0
        elapsed = self._clock() - self._started
        eta = None
        if self._fraction >= 1.0:
            eta = 0.0
        elif self._fraction >= MIN_FRACTION_FOR_ETA:
            eta = elapsed * (1.0 - self._fraction) / self._fraction
        return Overall(self._fraction, elapsed, eta)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"
