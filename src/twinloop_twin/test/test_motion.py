"""Scripted motions and the tracking/timing measures, checked against known truth."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_twin.motion import (ScriptedMotion, demo_motion, minimum_jerk, period_jitter_ms, rate_hz,
                                 tracking_report)
from twinloop_twin.physics import ARM_JOINTS

START = np.array([0.2, -1.0, 0.0])
GOAL = np.array([0.7, -0.4, -0.3])
DURATION_S = 2.0


def test_minimum_jerk_starts_and_ends_exactly_at_the_endpoints_and_holds_outside():
    np.testing.assert_array_equal(minimum_jerk(START, GOAL, DURATION_S, 0.0), START)
    np.testing.assert_allclose(minimum_jerk(START, GOAL, DURATION_S, DURATION_S), GOAL, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(minimum_jerk(START, GOAL, DURATION_S, -0.5), START)
    np.testing.assert_allclose(minimum_jerk(START, GOAL, DURATION_S, 3 * DURATION_S), GOAL, rtol=0, atol=1e-15)


def test_minimum_jerk_known_values_midpoint_and_quarter():
    # s(τ) = 10τ³ − 15τ⁴ + 6τ⁵: s(1/2) = 1/2, s(1/4) = 53/512
    np.testing.assert_allclose(minimum_jerk(START, GOAL, DURATION_S, DURATION_S / 2), (START + GOAL) / 2,
                               rtol=0, atol=1e-15)
    np.testing.assert_allclose(minimum_jerk(START, GOAL, DURATION_S, DURATION_S / 4),
                               START + (GOAL - START) * 53 / 512, rtol=0, atol=1e-15)


def test_minimum_jerk_is_rest_to_rest_with_the_known_peak_velocity():
    h = 1e-5

    def velocity(t):
        return (minimum_jerk(START, GOAL, DURATION_S, t + h) - minimum_jerk(START, GOAL, DURATION_S, t - h)) / (2 * h)

    # ends: velocity (and acceleration, hence an O(h²) one-sided error) vanish
    np.testing.assert_allclose(velocity(0.0), 0.0, atol=1e-8)
    np.testing.assert_allclose(velocity(DURATION_S), 0.0, atol=1e-8)
    # peak at the midpoint: 15/8 * distance / duration
    np.testing.assert_allclose(velocity(DURATION_S / 2), 1.875 * (GOAL - START) / DURATION_S, rtol=1e-8)


def test_scripted_motion_passes_through_every_waypoint_at_segment_boundaries():
    waypoints = np.array([[0.0, 0.0], [1.0, -1.0], [0.5, 2.0], [0.0, 0.0]])
    motion = ScriptedMotion(("a", "b"), waypoints, segment_s=1.5)
    assert motion.duration_s == pytest.approx(4.5)
    for index, waypoint in enumerate(waypoints):
        np.testing.assert_allclose(motion.at(index * 1.5), waypoint, atol=1e-12)
    np.testing.assert_allclose(motion.at(1.5 + 0.75), (waypoints[1] + waypoints[2]) / 2, atol=1e-12)
    np.testing.assert_allclose(motion.at(10.0), waypoints[-1], atol=1e-12)


def test_demo_motion_starts_and_ends_at_home_and_moves_every_joint():
    home = {name: 0.1 * i for i, name in enumerate(ARM_JOINTS)}
    motion = demo_motion(home, ARM_JOINTS, segment_s=2.0)
    home_vector = np.array([home[j] for j in ARM_JOINTS])
    np.testing.assert_allclose(motion.at(0.0), home_vector, atol=1e-12)
    np.testing.assert_allclose(motion.at(motion.duration_s), home_vector, atol=1e-12)
    excursion = np.max(np.abs(motion.waypoints - home_vector), axis=0)
    assert np.all((excursion >= 0.2 - 1e-12) & (excursion <= 0.4 + 1e-12)), excursion


def _commanded(t: np.ndarray) -> np.ndarray:
    """A smooth 3-joint command profile (rad); constant before t = 0."""
    t = np.maximum(t, 0.0)[:, None]
    return np.array([0.3, -0.5, 1.0]) * np.sin(2 * np.pi * np.array([0.7, 1.1, 0.4]) * t + np.array([0.0, 0.5, 1.0]))


NAMES = ("j1", "j2", "j3")
COMMAND_T = np.arange(0.0, 4.0, 0.01)  # 100 Hz
STATE_T = np.arange(-0.2, 4.2, 0.002)  # 500 Hz, overlapping both ends of the command stream


def test_tracking_report_recovers_a_known_latency():
    delay_s = 0.037
    report = tracking_report(COMMAND_T, _commanded(COMMAND_T), STATE_T, _commanded(STATE_T - delay_s), NAMES)
    assert report.latency_s == pytest.approx(delay_s, abs=0.002)


def test_tracking_report_recovers_a_latency_on_the_demo_motion():
    home = dict(zip(ARM_JOINTS, [0.0, -0.785398, 0.0, -2.356194, 0.0, 1.570796, 0.785398]))
    motion = demo_motion(home, ARM_JOINTS, segment_s=1.0)
    command_t = np.arange(0.0, motion.duration_s, 0.01)
    state_t = np.arange(0.0, motion.duration_s, 0.002)
    report = tracking_report(command_t, np.array([motion.at(t) for t in command_t]),
                             state_t, np.array([motion.at(t - 0.037) for t in state_t]), ARM_JOINTS)
    assert report.latency_s == pytest.approx(0.037, abs=0.002)


def _ramps(t: np.ndarray) -> np.ndarray:
    """Constant-velocity commands: linear interpolation between 100 Hz samples is exact."""
    return t[:, None] * np.array([0.1, -0.2, 0.05])


def test_tracking_report_rms_and_max_of_a_known_offset_and_ripple():
    offset = np.array([0.01, -0.003, 0.0])
    amplitude = np.array([0.0, 0.0, 0.02])  # a 5 Hz ripple: rms A/√2, max A (20 full periods)
    state_q = _ramps(STATE_T) + offset + amplitude * np.sin(2 * np.pi * 5.0 * STATE_T)[:, None]
    report = tracking_report(COMMAND_T, _ramps(COMMAND_T), STATE_T, state_q, NAMES)
    assert report.rms_rad["j1"] == pytest.approx(0.01, rel=1e-9)
    assert report.rms_rad["j2"] == pytest.approx(0.003, rel=1e-9)
    assert report.max_rad["j1"] == pytest.approx(0.01, rel=1e-9)
    assert report.max_rad["j2"] == pytest.approx(0.003, rel=1e-9)
    # 1000 samples per ripple period over 19.95 periods in the window: rms within 0.2 % of A/√2,
    # the sampled peak within 0.1 % of A
    assert report.rms_rad["j3"] == pytest.approx(0.02 / np.sqrt(2), rel=2e-3)
    assert report.max_rad["j3"] == pytest.approx(0.02, rel=1e-3)


def test_tracking_errors_are_against_the_command_as_sent_not_the_latency_aligned_one():
    # a ramp of velocity v delayed by 50 ms lags the command by exactly 0.05 v
    report = tracking_report(COMMAND_T, _ramps(COMMAND_T), STATE_T, _ramps(STATE_T - 0.05), NAMES)
    assert report.latency_s == pytest.approx(0.05, abs=0.002)
    for name, velocity in zip(NAMES, (0.1, -0.2, 0.05)):
        assert report.rms_rad[name] == pytest.approx(0.05 * abs(velocity), rel=1e-9)
        assert report.max_rad[name] == pytest.approx(0.05 * abs(velocity), rel=1e-9)


def test_tracking_report_ignores_states_outside_the_command_window():
    state_q = _ramps(STATE_T)
    state_q[(STATE_T < COMMAND_T[0]) | (STATE_T > COMMAND_T[-1])] += 5.0
    report = tracking_report(COMMAND_T, _ramps(COMMAND_T), STATE_T, state_q, NAMES)
    assert max(report.max_rad.values()) < 1e-12


def test_rate_hz_of_regular_stamps():
    assert rate_hz(100.0 + np.arange(501) / 250.0) == pytest.approx(250.0, rel=1e-9)
    assert rate_hz(np.array([3.0])) == 0.0
    assert rate_hz(np.array([])) == 0.0


def test_rate_hz_counts_periods_not_stamps_on_irregular_stamps():
    # 4 periods over 1 s, whatever their spread
    assert rate_hz(np.array([0.0, 0.1, 0.2, 0.9, 1.0])) == pytest.approx(4.0, rel=1e-12)


def test_period_jitter_percentiles_on_synthetic_stamps():
    rng = np.random.default_rng(3)
    periods_s = np.array([0.004] * 980 + [0.009] * 20)  # 2 % late periods
    rng.shuffle(periods_s)
    stamps = 12.5 + np.concatenate([[0.0], np.cumsum(periods_s)])
    p50, p99 = period_jitter_ms(stamps)
    assert p50 == pytest.approx(4.0, abs=1e-9)
    assert p99 == pytest.approx(9.0, abs=1e-9)
    p50, p99 = period_jitter_ms(np.arange(101) * 0.002)
    assert (p50, p99) == (pytest.approx(2.0, abs=1e-9), pytest.approx(2.0, abs=1e-9))
