"""The live run's minimum-jerk moves: fixed-period steps under the speed limit."""
from __future__ import annotations

import numpy as np

from twinloop_calibration.live import move_targets


def test_moves_are_steps_of_the_command_period_under_the_speed_limit():
    start, goal = np.zeros(7), np.array([0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2])
    targets = np.array(move_targets(start, goal, max_speed_rad_s=0.6, period_s=0.004))
    np.testing.assert_allclose(targets[-1], goal, atol=1e-12)
    speed = np.abs(np.diff(np.vstack([start, targets]), axis=0)) / 0.004
    assert speed.max() <= 0.6 + 1e-9 and speed.max() > 0.5  # minimum jerk peaks at the limit
    assert len(targets) == int(np.ceil(1.875 * 0.5 / 0.6 / 0.004))
