"""The joint-command contract: what reaches the actuators and what is refused, and why."""
from __future__ import annotations

import math

import numpy as np
import pytest

from twinloop_twin.contract import CommandRejected, check_joint_order, clamp_to_limits, parse_joint_command

JOINTS = ("panda_joint1", "panda_joint2", "panda_joint3", "panda_finger_joint1")


def test_full_command_in_robot_order_maps_each_name_to_its_position():
    assert parse_joint_command(JOINTS, [0.1, -0.2, 0.3, 0.04], JOINTS) == {
        "panda_joint1": 0.1, "panda_joint2": -0.2, "panda_joint3": 0.3, "panda_finger_joint1": 0.04}


def test_subset_in_any_order_keeps_name_position_pairs():
    targets = parse_joint_command(["panda_finger_joint1", "panda_joint2"], [0.02, -1.5], JOINTS)
    assert targets == {"panda_finger_joint1": 0.02, "panda_joint2": -1.5}


def test_positions_come_back_as_python_floats():
    targets = parse_joint_command(["panda_joint1"], np.array([0.25], dtype=np.float32), JOINTS)
    assert type(targets["panda_joint1"]) is float
    assert targets["panda_joint1"] == pytest.approx(0.25, abs=0.0)


def _rejection(names, positions) -> CommandRejected:
    with pytest.raises(CommandRejected) as caught:
        parse_joint_command(names, positions, JOINTS)
    return caught.value


def test_command_naming_no_joint_is_malformed():
    assert _rejection([], []).code == "MALFORMED_COMMAND"


@pytest.mark.parametrize("names, positions", [
    (["panda_joint1", "panda_joint2"], [0.1]),
    (["panda_joint1"], [0.1, 0.2]),
    (["panda_joint1"], []),
])
def test_name_position_length_mismatch_is_malformed(names, positions):
    error = _rejection(names, positions)
    assert error.code == "MALFORMED_COMMAND"
    assert f"{len(names)} names but {len(positions)} positions" in str(error)


def test_duplicate_joint_is_malformed_and_named():
    error = _rejection(["panda_joint1", "panda_joint2", "panda_joint1"], [0.1, 0.2, 0.3])
    assert error.code == "MALFORMED_COMMAND"
    assert "panda_joint1" in str(error)
    assert "panda_joint2" not in str(error)


def test_unknown_joint_message_lists_the_unknown_and_every_valid_name():
    error = _rejection(["panda_joint1", "joint_1"], [0.1, 0.2])
    assert error.code == "UNKNOWN_JOINT"
    message = str(error)
    assert "'joint_1'" in message
    for name in JOINTS:
        assert name in message
    # the known joint is listed as valid, not as unknown
    unknown_part = message.split(";")[0]
    assert "panda_joint1" not in unknown_part


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_target_is_rejected_and_the_joint_named(bad):
    error = _rejection(["panda_joint1", "panda_joint3"], [0.1, bad])
    assert error.code == "NON_FINITE_COMMAND"
    assert "panda_joint3" in str(error)
    assert "panda_joint1" not in str(error)


def test_command_rejected_is_a_value_error():
    assert issubclass(CommandRejected, ValueError)


def test_joint_order_accepts_any_permutation_of_the_expected_joints():
    check_joint_order(JOINTS, list(reversed(JOINTS)))


@pytest.mark.parametrize("received, missing, extra", [
    (JOINTS[:-1], "panda_finger_joint1", None),
    ((*JOINTS, "panda_joint9"), None, "panda_joint9"),
])
def test_joint_order_rejects_missing_or_extra_joints(received, missing, extra):
    with pytest.raises(CommandRejected) as caught:
        check_joint_order(JOINTS, received)
    assert caught.value.code == "UNKNOWN_JOINT"
    assert f"missing {[missing] if missing else []}" in str(caught.value)
    assert f"unexpected {[extra] if extra else []}" in str(caught.value)


def test_clamp_to_limits_clamps_both_sides_and_passes_unlimited_joints():
    limits = {"panda_joint1": (-2.0, 2.0), "panda_finger_joint1": (0.0, 0.04)}
    clamped = clamp_to_limits({"panda_joint1": 3.5, "panda_finger_joint1": -0.01, "panda_joint2": 7.0}, limits)
    assert clamped == {"panda_joint1": 2.0, "panda_finger_joint1": 0.0, "panda_joint2": 7.0}
    assert clamp_to_limits({"panda_joint1": -1.25}, limits) == {"panda_joint1": -1.25}
