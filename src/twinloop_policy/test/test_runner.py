"""The runner's core (twinloop_policy.runner, policy_spec): a policy folder checked against
the robot, observations with staleness, and one run stepped until goal, fault, stale input
or timeout."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from twinloop_policy.policy_spec import ObservationTerm, PolicyMismatch, check_against_robot, load_policy_spec
from twinloop_policy.runner import ObservationAssembler, PolicyLoop, PolicyRun, StaleObservation, load_module
from twinloop_policy.scripted import write_scripted_policy
from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS


def test_mismatched_policies_are_refused_with_every_problem_at_once(tmp_path, workcell):
    home = workcell.home_arm_positions
    problems = {}
    for label, kwargs in (("size", dict(observation_size=6)),
                          ("names", dict(joints=[f"joint_a{i}" for i in range(1, 8)])),
                          ("rate", dict(rate_hz=1000.0))):
        spec = load_policy_spec(write_scripted_policy(tmp_path / label, home, **kwargs).folder)
        with pytest.raises(PolicyMismatch) as refused:
            check_against_robot(spec, commandable=COMMANDED_JOINTS, measured=ALL_JOINTS, joint_state_rate_hz=500.0)
        problems[label] = str(refused.value)
    assert "declares size 6 but lists 7 joints" in problems["size"]
    assert "joint_a1" in problems["names"] and "not commandable" in problems["names"]
    assert "faster than the robot's joint states" in problems["rate"]


@pytest.fixture
def run_parts(tmp_path, workcell):
    home = workcell.home_arm_positions
    spec = load_policy_spec(write_scripted_policy(tmp_path / "reach", [home[0] + 0.1] + home[1:], rate_hz=250.0,
                                                  timeout_s=2.0, max_age_s=0.02).folder)
    return spec, PolicyLoop(spec, load_module(spec)), ObservationAssembler(spec), dict(zip(ARM_JOINTS, home))


def test_observations_older_than_their_max_age_are_refused(run_parts):
    spec, _, assembler, home = run_parts
    with pytest.raises(StaleObservation, match="is inf ms old"):  # nothing received yet
        assembler.assemble(0.0)
    assembler.on_joint_state(list(home), list(home.values()), [0.0] * 7, 10.0)
    assert list(assembler.assemble(10.019)) == list(home.values())
    with pytest.raises(StaleObservation, match="21.0 ms old"):
        assembler.assemble(10.021)


def test_a_run_ends_at_the_goal_on_a_fault_on_stale_input_or_at_its_timeout(run_parts):
    spec, loop, assembler, home = run_parts
    period = 1.0 / spec.rate_hz
    # At the goal from the start: done on the first step, which still sends its targets.
    goal = dict(home, **spec.goal_joint_positions)
    assembler.on_joint_state(list(goal), list(goal.values()), [0.0] * 7, 0.0)
    run = PolicyRun(loop, assembler, timeout_s=2.0)
    assert run.step(0.001) is not None and run.outcome == (True, "goal reached") and run.done.is_set()
    # Away from it: a latched fault of the monitor ends the run with its reason.
    assembler.on_joint_state(list(home), list(home.values()), [0.0] * 7, 1.0)
    run = PolicyRun(loop, assembler, timeout_s=2.0)
    assert run.step(1.001) is not None and not run.done.is_set()
    run.step(1.001 + period, fault="fault 3, velocity limit")
    assert run.outcome == (False, "envelope fault 3, velocity limit")
    # Joint states that stop: steps are skipped (nothing sent), and stale_abort_s ends the run.
    run = PolicyRun(loop, assembler, timeout_s=2.0, stale_abort_s=0.1)
    t, sent = 1.0, []
    while not run.done.is_set() and t < 2.0:
        sent.append(run.step(t))
        t += period
    assert run.outcome[0] is False and run.outcome[1].startswith("stopped: observation 'joint_position' is")
    assert sent[0] is not None and all(s is None for s in sent[6:]) and run.stale_skips >= 0.1 / period
    assert 0.02 + 0.1 <= t - 1.0 <= 0.02 + 0.1 + 3 * period
    # Fresh states that never reach the goal: the timeout.
    run = PolicyRun(loop, assembler, timeout_s=0.5)
    t = 3.0
    while not run.done.is_set():
        assembler.on_joint_state(list(home), list(home.values()), [0.0] * 7, t)
        run.step(t)
        t += period
    assert run.outcome[0] is False and run.outcome[1].startswith("timeout after 0.5")


class _ArmPart(torch.nn.Module):
    """A policy that holds the arm where it is (the first seven observation values)."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[:7]


def test_a_box_goal_is_judged_by_a_pose_of_the_box_at_rest_received_after_the_timeout(run_parts):
    """A tracker that lost the box while the hand hid it last saw it before it came to rest: the
    run goes on (stepped, its targets sent, the box pose's age no longer stopping it) until a
    pose received after the timeout comes that agrees with the one before it within
    judge_settle_m (3 mm), then judges by it; a box that slides on past the timeout is judged
    where it stops, not where it was first seen; after judge_wait_s without a pose, by the
    last one, its age said; without a box at rest, by the last pose, its motion said. The box
    term's max_age_s is the trial's timeout, as an exported carry policy's is."""
    spec, _, _, home = run_parts
    timeout = 1.0
    spec = dataclasses.replace(spec, goal_joint_positions={}, goal_box_xy=(0.5, 0.0), goal_radius_m=0.015,
                               observation=spec.observation + (ObservationTerm(
                                   "box", "box_position", (), 2, timeout, topic="/box"),))
    loop, period = PolicyLoop(spec, torch.jit.script(_ArmPart())), 1.0 / spec.rate_hz

    def run_until(run, poses):
        """Step at the policy's rate, fresh joint states each period, box poses (t, xy) as they fall due."""
        t, sent, poses = 0.0, [], list(poses)
        while not run.done.is_set() and t < 10.0:
            assembler.on_joint_state(list(home), list(home.values()), [0.0] * 7, t)
            while poses and t >= poses[0][0]:
                assembler.on_box_position("/box", *poses.pop(0)[1], t)
            sent.append(run.step(t))
            t += period
        return t, sent

    seen = (0.0, (0.45, 0.0))  # at the start
    lost = (0.3, (0.45, 0.0))  # the last pose before the hand hid the box: 5 cm short
    assembler = ObservationAssembler(spec)
    run = PolicyRun(loop, assembler, timeout_s=timeout)
    # at rest in the goal, seen 1.3 s after the timeout (the lost pose 2 s old by then), and
    # again 0.5 s later, 1 mm away (the tracker's noise)
    t, sent = run_until(run, [seen, lost, (2.3, (0.5, 0.005)), (2.8, (0.501, 0.005))])
    assert run.outcome == (True, "box 0.5 cm from the goal (within 1.5 cm)")
    assert 2.8 <= t <= 2.8 + 2 * period and all(s is not None for s in sent)
    # slipping past the timeout: first seen in the goal, judged where it stops, 2 cm beyond
    assembler = ObservationAssembler(spec)
    run = PolicyRun(loop, assembler, timeout_s=timeout)
    sliding = [(1.2, (0.49, 0.0)), (1.7, (0.505, 0.0)), (2.2, (0.518, 0.0)), (2.7, (0.52, 0.0)), (3.2, (0.52, 0.0))]
    t, sent = run_until(run, [seen, lost, *sliding])
    assert run.outcome == (False, "box 2.0 cm from the goal (outside 1.5 cm)")
    assert 2.7 <= t <= 2.7 + 2 * period
    # still sliding when judge_wait_s runs out: the last pose judges, the motion said
    assembler = ObservationAssembler(spec)
    run = PolicyRun(loop, assembler, timeout_s=timeout, judge_wait_s=1.0)
    t, sent = run_until(run, [seen, lost, *sliding[:3]])
    assert 2.0 <= t <= 2.0 + 2 * period
    assert run.outcome == (True, "box 0.5 cm from the goal (within 1.5 cm; the box had not come to rest 1.0 s "
                                 "after the trial's end: it moved 15 mm between its last two poses)")
    assembler = ObservationAssembler(spec)
    run = PolicyRun(loop, assembler, timeout_s=timeout, judge_wait_s=1.0)
    t, sent = run_until(run, [seen, lost])
    assert 2.0 <= t <= 2.0 + 2 * period and all(s is not None for s in sent)
    assert run.outcome == (False, "box 5.0 cm from the goal (outside 1.5 cm; judged by a box pose 1.7 s old: none "
                                  "came within 1.0 s of the trial's end)")
