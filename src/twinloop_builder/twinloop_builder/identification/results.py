"""What identification returns: per-parameter estimates, per-stage fits and reports, the
held-out score, and the whole result. Pure Python."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Estimate:
    name: str
    mean: float
    std: float
    ci_low: float
    ci_high: float
    prior: float
    identifiable: bool
    note: str = ""


def unidentified(name: str, prior: float, note: str) -> Estimate:
    """The prior kept, with no interval: nothing in the data determines it."""
    return Estimate(name, prior, float("nan"), float("nan"), float("nan"), prior, False, note)


@dataclass
class StageReport:
    name: str
    parameters: list[str]
    recordings: list[str]
    iterations: int
    residual_evaluations: int
    cost_before: float
    cost_after: float
    # the residuals' integrated autocorrelation time (1: white); a diagnostic since the
    # intervals come from the Newey-West covariance (fit.fit_least_squares)
    autocorrelation_inflation: float
    wall_s: float
    residual_rms: float = float("nan")  # in units of the assumed sensor noise (≈ 1 when the model explains the data)


@dataclass
class StageFit:
    """One fitted stage, in its optimizer variables (log-multipliers; the delay in DELAY_UNIT_S)."""

    x: np.ndarray  # the optimum
    covariance: np.ndarray  # of x
    half_width: np.ndarray  # of each variable's confidence interval, in x
    report: StageReport
    jacobian: np.ndarray | None = None  # of the weighted residual at x (None: not a least-squares fit)


@dataclass
class StageOutcome:
    """What a stage (or a group of stages) found, in parameter names."""

    estimates: dict[str, Estimate] = field(default_factory=dict)
    reports: list[StageReport] = field(default_factory=list)
    correlations: dict[tuple[str, str], float] = field(default_factory=dict)
    guidance: list[str] = field(default_factory=list)
    # combinations the data determines when their parts are not (e.g. box.mass_kg*box.friction)
    derived: dict[str, Estimate] = field(default_factory=dict)

    def add(self, other: "StageOutcome") -> None:
        self.estimates.update(other.estimates)
        self.reports += other.reports
        self.correlations.update(other.correlations)
        self.guidance += other.guidance
        self.derived.update(other.derived)

    def fitted_values(self) -> dict[str, float]:
        """Means of the parameters that were fitted (those with a std)."""
        return {n: e.mean for n, e in self.estimates.items() if not math.isnan(e.std)}


@dataclass(frozen=True)
class HeldOutScore:
    """Open-loop RMSE on held-out recordings, prior vs identified: the arm's joint positions,
    its joint efforts, the box's table-plane position (NaN: no recording moved the box)."""

    rmse_before_rad: float
    rmse_after_rad: float
    per_joint: dict[str, tuple[float, float]]  # joint -> (before, after)
    effort_rmse_before_nm: float = float("nan")
    effort_rmse_after_nm: float = float("nan")
    box_rmse_before_m: float = float("nan")
    box_rmse_after_m: float = float("nan")


@dataclass
class IdentificationResult:
    estimates: dict[str, Estimate]
    stages: list[StageReport]
    guidance: list[str]
    correlations: dict[tuple[str, str], float]
    held_out_rmse_before_rad: float = float("nan")
    held_out_rmse_after_rad: float = float("nan")
    held_out_per_joint: dict[str, tuple[float, float]] = field(default_factory=dict)
    held_out: HeldOutScore | None = None  # every held-out error (set_held_out)
    # combinations the data determines when their parts are not (e.g. box.mass_kg*box.friction)
    derived: dict[str, Estimate] = field(default_factory=dict)

    @property
    def not_identifiable(self) -> list[str]:
        return [n for n, e in self.estimates.items() if not e.identifiable]

    def values(self) -> dict[str, float]:
        return {n: e.mean for n, e in self.estimates.items()}

    def set_held_out(self, score: HeldOutScore) -> None:
        self.held_out_rmse_before_rad = score.rmse_before_rad
        self.held_out_rmse_after_rad = score.rmse_after_rad
        self.held_out_per_joint = dict(score.per_joint)
        self.held_out = score
