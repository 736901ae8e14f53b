"""Success rates and sim-vs-real agreement, as the loop reports them.

Pure Python (numpy, scipy). `wilson_interval`: a success rate's 95 % interval (training's
evaluation, held-out trials). `sim_real_agreement`: how well a twin's predicted success
ranks and tracks the real success of several policies, as SIMPLER (Li et al. 2024,
"Evaluating Real-World Robot Manipulation Policies in Simulation") and SimFoundry report it:
Pearson r (scipy.stats.pearsonr) and the Mean Maximum Rank Violation (MMRV). No maintained
library computes MMRV; it is written here from the paper's definition:

    MMRV = 1/N sum_i max_j |R_i - R_j| * 1[(S_i < S_j) != (R_i < R_j)]

over N policies with real success R and simulated success S: for each policy, the largest
real-success gap to a policy the twin ranks the other way round; 0 when the twin ranks
every pair as the real cell does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate (z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mmrv(real: Sequence[float], simulated: Sequence[float]) -> float:
    """Mean Maximum Rank Violation of simulated against real success rates (0: ranks agree)."""
    r, s = np.asarray(real, dtype=float), np.asarray(simulated, dtype=float)
    if r.shape != s.shape or r.ndim != 1 or len(r) < 2:
        raise ValueError(f"give the same number (>= 2) of real and simulated success rates, got {r.shape} and "
                         f"{s.shape}")
    violated = (s[:, None] < s[None, :]) != (r[:, None] < r[None, :])
    gaps = np.abs(r[:, None] - r[None, :]) * violated
    return float(gaps.max(axis=1).mean())


@dataclass(frozen=True)
class Agreement:
    pearson_r: float  # nan when either side is constant
    mmrv: float
    policies: int


def sim_real_agreement(real: Sequence[float], simulated: Sequence[float]) -> Agreement:
    """Pearson r and MMRV of a twin's predicted success against the real success of the same policies."""
    from scipy.stats import pearsonr
    r, s = np.asarray(real, dtype=float), np.asarray(simulated, dtype=float)
    violation = mmrv(r, s)
    if np.ptp(r) == 0.0 or np.ptp(s) == 0.0:
        return Agreement(float("nan"), violation, len(r))
    return Agreement(float(pearsonr(s, r).statistic), violation, len(r))
