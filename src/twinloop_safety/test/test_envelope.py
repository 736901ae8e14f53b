"""The envelope's pure core: limits from the URDF, each check, the latched state machine."""
from __future__ import annotations

import math

import numpy as np
import pytest
from twinloop_interfaces.msg import EnvelopeStatus

from twinloop_safety.envelope import (Box, EnvelopeConfigError, EnvelopeMonitor, Fault, State, boxes_from_flat,
                                      build_limits, tighten_from_twin)
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.parameters import Parameter, ParameterSet
from twinloop_twin.physics import COMMANDED_JOINTS
from twinloop_twin.workcell import load_workcell

ARM = [f"panda_joint{i}" for i in range(1, 8)]


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def kinematics(workcell):
    return UrdfTransforms(workcell.urdf_xml)


def make_limits(kinematics, **overrides):
    config = dict(joint_names=list(COMMANDED_JOINTS), position_margins=[0.05] * 7 + [0.0], velocity_scale=0.5,
                  acceleration_limits=[7.5] * 7 + [1.0], max_target_lead=[0.25] * 7 + [0.04],
                  command_period_s=0.004, limit_mode="reject",
                  workspace=Box("workspace", (-0.35, -0.55, 0.77), (0.85, 0.55, 1.75)), keep_out=(),
                  cartesian_margin_m=0.0, checked_links=("panda_hand", "panda_hand_tcp"),
                  sample_spacing_rad=0.02, max_force_n=60.0, command_timeout_s=0.1, joint_state_timeout_s=0.1)
    config.update(overrides)
    return build_limits(kinematics, **config)


def armed(kinematics, workcell, **overrides) -> EnvelopeMonitor:
    monitor = EnvelopeMonitor(make_limits(kinematics, **overrides), kinematics)
    home = workcell.home_joint_positions
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * len(home), 0.0)
    assert monitor.arm() == ""
    return monitor


def test_fault_and_state_codes_match_the_message():
    for fault in Fault:
        assert getattr(EnvelopeStatus, f"FAULT_{fault.name}") == fault.value
    for state in State:
        assert getattr(EnvelopeStatus, f"STATE_{state.name}") == state.value


def test_limits_come_from_the_urdf(kinematics):
    limits = make_limits(kinematics)
    j4 = limits.joint_names.index("panda_joint4")
    # Franka Panda joint 4: [-3.0718, -0.0698] rad, 2.175 rad/s.
    assert limits.lower[j4] == pytest.approx(-3.0718 + 0.05)
    assert limits.upper[j4] == pytest.approx(-0.0698 - 0.05)
    assert limits.velocity[j4] == pytest.approx(2.175 * 0.5)


def test_bad_configuration_is_named(kinematics):
    with pytest.raises(EnvelopeConfigError, match="position_margins has 2 values"):
        make_limits(kinematics, position_margins=[0.1, 0.1])
    with pytest.raises(EnvelopeConfigError, match="no range"):
        make_limits(kinematics, position_margins=[3.0] * 7 + [0.0])
    with pytest.raises(EnvelopeConfigError, match="6 numbers"):
        boxes_from_flat([0, 0, 0, 1, 1], ["a"])
    with pytest.raises(EnvelopeConfigError, match="checked_links"):
        make_limits(kinematics, checked_links=("no_such_link",))


def test_names_finiteness_and_position_limits(kinematics, workcell):
    home = workcell.home_joint_positions
    cases = [(["elbow"], [0.0], Fault.UNKNOWN_JOINT),
             (["panda_joint1", "panda_joint1"], [0.0, 0.0], Fault.UNKNOWN_JOINT),
             (["panda_joint1"], [math.nan], Fault.NON_FINITE_COMMAND),
             (["panda_joint1"], [math.inf], Fault.NON_FINITE_COMMAND),
             (["panda_joint4"], [-0.0698 - 0.04], Fault.POSITION_LIMIT)]
    for names, positions, fault in cases:
        monitor = armed(kinematics, workcell)
        decision = monitor.check_command(names, positions, 0.01)
        assert decision.forward is None and decision.violation.fault is fault, (names, positions)
        assert monitor.state is State.FAULT
        assert monitor.hold_positions == pytest.approx({j: home[j] for j in COMMANDED_JOINTS})


def test_velocity_and_acceleration(kinematics, workcell):
    home = workcell.home_joint_positions["panda_joint1"]
    monitor = armed(kinematics, workcell)
    # 0.004 rad per 4 ms step = 1.0 rad/s: under the 1.0875 rad/s limit.
    step = 0.0
    for k in range(1, 30):
        step = min(0.004, step + 7.0 * 0.004 ** 2)  # accelerate at 7 rad/s^2 (< 7.5)
        target = home + sum(min(0.004, i * 7.0 * 0.004 ** 2) for i in range(1, k + 1))
        decision = monitor.check_command(["panda_joint1"], [target], 0.004 * k)
        assert decision.violation is None, decision.violation
        assert decision.forward == [target]  # unchanged
        monitor.on_joint_state(["panda_joint1"], [target], [0.0], 0.004 * k)
    # A step of 0.0046 rad: 1.15 rad/s.
    decision = monitor.check_command(["panda_joint1"], [target + 0.0046], 0.004 * 30)
    assert decision.violation.fault is Fault.VELOCITY_LIMIT and decision.violation.joints == ("panda_joint1",)

    monitor = armed(kinematics, workcell)
    assert monitor.check_command(["panda_joint1"], [home + 0.002], 0.004).violation is None
    assert monitor.check_command(["panda_joint1"], [home + 0.004], 0.008).violation is None
    # From 0.5 rad/s to 0.0 in one 4 ms step: -125 rad/s^2.
    decision = monitor.check_command(["panda_joint1"], [home + 0.004], 0.012)
    assert decision.violation.fault is Fault.ACCELERATION_LIMIT


def test_rate_limit_mode_clamps_to_the_limits(kinematics, workcell):
    home = workcell.home_joint_positions["panda_joint1"]
    monitor = armed(kinematics, workcell, limit_mode="rate_limit")
    decision = monitor.check_command(["panda_joint1"], [home + 0.1], 0.004)
    assert decision.violation is None and decision.limited
    step = 2.175 * 0.5 * 0.004  # v_max * T
    assert decision.forward[0] == pytest.approx(home + step)
    decision = monitor.check_command(["panda_joint1"], [home + 0.2], 0.008)
    assert decision.forward[0] == pytest.approx(home + 2 * step)
    # Next step asks to stop dead: clamped to a deceleration of 7.5 rad/s^2.
    decision = monitor.check_command(["panda_joint1"], [home + 2 * step], 0.012)
    expected_velocity = 2.175 * 0.5 - 7.5 * 0.004
    assert decision.limited and decision.forward[0] == pytest.approx(home + 2 * step + expected_velocity * 0.004)


def test_keep_out_is_checked_along_the_step(kinematics, workcell):
    # Joint 1 from -0.3 to +0.3 rad swings the hand (0.307 m from the axis) through y = 0;
    # a thin box at y = 0 is entered only between the two ends of the step.
    home = dict(workcell.home_joint_positions)
    thin = Box("thin", (0.25, -0.01, 1.30), (0.35, 0.01, 1.40))
    monitor = EnvelopeMonitor(make_limits(kinematics, keep_out=(thin,), command_period_s=1.0,
                                          max_target_lead=[1.0] * 8, acceleration_limits=[100.0] * 8),
                              kinematics)
    home["panda_joint1"] = -0.3
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 0.0)
    hand_start = monitor.link_positions(np.array([home[j] for j in COMMANDED_JOINTS]))[0]
    assert not thin.contains(hand_start[None])[0]
    assert monitor.arm() == ""
    decision = monitor.check_command(["panda_joint1"], [0.3], 0.01)
    assert decision.violation.fault is Fault.KEEP_OUT and "thin" in decision.violation.reason


def test_workspace_box(kinematics, workcell):
    home = workcell.home_joint_positions
    monitor = armed(kinematics, workcell, workspace=Box("workspace", (-0.35, -0.55, 1.30), (0.85, 0.55, 1.75)))
    # The TCP sits at z = 1.237 m at home: below the box floor of 1.30.
    decision = monitor.check_command(["panda_joint1"], [home["panda_joint1"]], 0.01)
    assert decision.violation.fault is Fault.WORKSPACE and "panda_hand_tcp" in decision.violation.reason



def test_a_link_pushed_into_the_margin_band_may_be_held_and_moved_back_never_deeper(kinematics, workcell):
    # The hand measured 5 mm below the checked floor (inside the 20 mm margin band, as a hand
    # pressed down by a box it pushes): held there and moved up, yes; moved down, no. Measured
    # 30 mm below it (beyond the band, past the true floor): every command faults.
    home = dict(workcell.home_joint_positions)
    q_home = np.array([home[j] for j in COMMANDED_JOINTS])
    probe = EnvelopeMonitor(make_limits(kinematics), kinematics)
    tcp_z = probe.link_positions(q_home)[1, 2]
    lower, raise_ = dict(home), dict(home)
    lower["panda_joint4"] -= 0.05
    raise_["panda_joint4"] += 0.05
    dz_down = probe.link_positions(np.array([lower[j] for j in COMMANDED_JOINTS]))[1, 2] - tcp_z
    dz_up = probe.link_positions(np.array([raise_[j] for j in COMMANDED_JOINTS]))[1, 2] - tcp_z
    assert dz_down < -0.005 and dz_up > 0.005  # joint 4 bent further (more negative) lowers the hand

    def monitor_with_floor(checked_floor_z):
        margin = 0.02
        workspace = Box("workspace", (-0.35, -0.55, checked_floor_z - margin), (0.85, 0.55, 1.75))
        return armed(kinematics, workcell, workspace=workspace, cartesian_margin_m=margin, command_period_s=1.0,
                     max_target_lead=[1.0] * 8, acceleration_limits=[100.0] * 8)

    monitor = monitor_with_floor(tcp_z + 0.005)
    assert monitor.check_command(["panda_joint4"], [home["panda_joint4"]], 0.01).violation is None  # held
    monitor = monitor_with_floor(tcp_z + 0.005)
    assert monitor.check_command(["panda_joint4"], [raise_["panda_joint4"]], 0.01).violation is None  # back up
    monitor = monitor_with_floor(tcp_z + 0.005)
    decision = monitor.check_command(["panda_joint4"], [lower["panda_joint4"]], 0.01)
    assert decision.violation.fault is Fault.WORKSPACE and "panda_hand_tcp" in decision.violation.reason
    monitor = monitor_with_floor(tcp_z + 0.03)
    decision = monitor.check_command(["panda_joint4"], [raise_["panda_joint4"]], 0.01)
    assert decision.violation.fault is Fault.WORKSPACE  # beyond the band: faults whatever the step

def test_watchdogs_force_and_reset(kinematics, workcell):
    monitor = armed(kinematics, workcell)
    assert monitor.tick(0.05) is None  # no command yet: the command watchdog has not started
    home = workcell.home_joint_positions
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 0.05)
    assert monitor.check_command(["panda_joint1"], [home["panda_joint1"]], 0.05).violation is None
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 0.14)
    assert monitor.tick(0.14) is None
    assert monitor.tick(0.16).fault is Fault.STALE_COMMAND
    assert monitor.check_command(["panda_joint1"], [home["panda_joint1"]], 0.16).forward is None
    assert monitor.reset_fault() == (Fault.STALE_COMMAND, "")
    assert monitor.state is State.ARMED
    assert monitor.tick(0.25).fault is Fault.STALE_JOINT_STATE  # last joint state at 0.14
    cleared, refusal = monitor.reset_fault()
    assert cleared is Fault.STALE_JOINT_STATE and "stale" in refusal and monitor.state is State.FAULT
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 0.27)
    assert monitor.reset_fault()[1] == ""
    assert monitor.on_force((0.0, 0.0, 59.0), 0.28) is None
    assert monitor.on_force((40.0, 0.0, 50.0), 0.28).fault is Fault.FORCE_LIMIT  # 64 N
    assert "still" in monitor.reset_fault()[1]


def test_stale_joint_states_refuse_arming_until_one_arrives(kinematics, workcell):
    monitor = EnvelopeMonitor(make_limits(kinematics), kinematics)
    assert "no fresh joint state" in monitor.arm()  # none yet
    home = workcell.home_joint_positions
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 1.0)
    assert monitor.tick(1.05) is None and monitor.arm() == ""
    monitor.disarm()
    assert monitor.tick(1.2) is None  # disarmed: no fault, but the verdict is kept
    assert "no fresh joint state" in monitor.arm()
    monitor.on_joint_state(list(home), list(home.values()), [0.0] * 9, 1.3)
    assert monitor.arm() == ""


def test_disarmed_forwards_nothing(kinematics, workcell):
    monitor = armed(kinematics, workcell)
    monitor.disarm()
    decision = monitor.check_command(["panda_joint1"], [0.0], 0.01)
    assert decision.forward is None and decision.violation is None and monitor.state is State.DISARMED


def test_twin_uncertainty_widens_the_margins(kinematics):
    limits = make_limits(kinematics)
    twin = ParameterSet({"command.delay_s": Parameter(mean=0.008, std=0.005, identifiable=False, unit="s",
                                                      source="nominal")})
    tight = tighten_from_twin(limits, twin, k_sigma=3.0, max_cartesian_speed_m_s=1.0)
    j1 = limits.joint_names.index("panda_joint1")
    # 3 sigma = 15 ms at 1.0875 rad/s: 16.3 mrad more margin; 15 mm more Cartesian margin.
    assert tight.upper[j1] == pytest.approx(limits.upper[j1] - 1.0875 * 0.015)
    assert tight.cartesian_margin_m == pytest.approx(0.015)
