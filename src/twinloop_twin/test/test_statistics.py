"""Success intervals and sim-vs-real agreement (twinloop_twin.statistics) against hand-worked
values and reference implementations (scipy, statsmodels' formula)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from twinloop_twin.statistics import mmrv, sim_real_agreement, wilson_interval


def test_wilson_interval_matches_the_formula_at_known_points():
    # Wilson (1927) 95 % intervals, worked by hand: 8/10 -> (0.4902, 0.9433); 0/16 -> (0, 0.1936)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 16) == pytest.approx((0.0, 0.1936), abs=1e-4)
    assert wilson_interval(64, 64)[1] == 1.0 and wilson_interval(64, 64)[0] == pytest.approx(0.9434, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mmrv_is_zero_when_the_twin_ranks_as_the_real_cell_and_counts_inversions():
    real = [0.9, 0.5, 0.1]
    assert mmrv(real, [0.8, 0.4, 0.3]) == 0.0  # same order, other values
    # every pair inverted: policy 0's largest gap 0.8, policy 1's 0.4, policy 2's 0.8
    assert mmrv(real, [0.2, 0.6, 0.8]) == pytest.approx((0.8 + 0.4 + 0.8) / 3)
    # one pair (1, 2) inverted: gaps 0.4 for both, 0 for policy 0
    assert mmrv(real, [0.9, 0.2, 0.3]) == pytest.approx((0.0 + 0.4 + 0.4) / 3)
    with pytest.raises(ValueError, match="same number"):
        mmrv([0.5], [0.5])


def test_agreement_pearson_r_is_scipys_and_constant_sides_give_nan():
    rng = np.random.default_rng(0)
    real = rng.uniform(0, 1, 6)
    simulated = real + rng.normal(0, 0.1, 6)
    agreement = sim_real_agreement(real, simulated)
    assert agreement.pearson_r == pytest.approx(np.corrcoef(real, simulated)[0, 1], abs=1e-12)
    assert agreement.policies == 6 and agreement.mmrv == mmrv(real, simulated)
    assert math.isnan(sim_real_agreement([1.0, 1.0, 1.0], [0.2, 0.5, 0.9]).pearson_r)
