"""The trial sequence (twinloop_policy.trials) on an in-process workcell behind the envelope
monitor's core (conftest.SimulatedCell): trials that reach the goal, in the right order,
recorded; and every way a sequence must stop, with the code and the message it stops with."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_policy.scripted import write_scripted_policy
from twinloop_policy.trials import TrialFailed, TrialPlan, TrialSequence
from twinloop_safety.envelope import State

PER_TRIAL = ["disarm", "reset_scene", "start_recording", "arm", "run_policy", "disarm", "stop_recording"]


@pytest.fixture
def reach(tmp_path, workcell):
    home = workcell.home_arm_positions
    return write_scripted_policy(tmp_path / "reach", [home[0] + 0.15, home[1] + 0.1] + home[2:], rate_hz=250.0,
                                 timeout_s=10.0, max_age_s=0.05)


def plan(spec, **overrides) -> TrialPlan:
    values = dict(policy_name=spec.name, policy_version=spec.policy_version, twin_version="emulated/v0",
                  num_trials=2, split="held_out", record=True, timeout_s=spec.trial_timeout_s, settle_s=0.1)
    values.update(overrides)
    return TrialPlan(**values)


def test_trials_reach_the_goal_recorded_and_through_the_monitor(cell, reach):
    cell.load(reach)
    sequence = TrialSequence(plan(reach), cell, clock=cell.now_s)
    outcomes = sequence.run()
    assert [(o.index, o.success, o.reason) for o in outcomes] == [(0, True, "goal reached"), (1, True, "goal reached")]
    # 0.15 rad at <= 0.5 rad/s with 2 rad/s^2 ramps: ~1.5 s of motion (simulated time).
    assert all(0.8 < o.duration_s < 6.0 for o in outcomes), outcomes
    assert cell.calls == PER_TRIAL * 2
    assert [(index, split) for _, index, split in cell.sessions] == [(0, "held_out"), (1, "held_out")]
    assert cell.sessions[0][0].endswith(f"-{reach.name}-t000") and cell.sessions[1][0].endswith("-t001")
    assert [o.bag_path for o in outcomes] == [f"bags/{s[0]}" for s in cell.sessions]
    assert [status for _, status in sequence.updates] == ["resetting", "recording", "running"] * 2
    # Every target the policy sent went through the monitor unchanged; the arm is at the goal.
    assert len(cell.sent) > 300 and cell.forwarded == cell.sent and cell.monitor.state is State.DISARMED
    q = cell.sim.true_joint_positions()
    assert abs(q["panda_joint1"] - reach.goal_joint_positions["panda_joint1"]) < reach.goal_tolerance_rad


def test_a_trial_is_not_run_while_the_recorder_lacks_a_required_topic(cell, reach):
    cell.load(reach)
    cell.recorded_topics = ("/joint_states",)
    sequence = TrialSequence(plan(reach, num_trials=1), cell, clock=cell.now_s)
    with pytest.raises(TrialFailed) as failed:
        sequence.run()
    assert failed.value.code == "NOT_READY"
    assert "['/joint_command']" in str(failed.value) and "not run" in str(failed.value)
    assert "bag kept: bags/" in str(failed.value)
    assert cell.calls == ["disarm", "reset_scene", "start_recording", "stop_recording"]  # closed, never armed
    assert cell.sent == [] and sequence.outcomes == []


def test_a_latched_fault_is_cleared_in_simulation_and_stops_trials_on_hardware(cell, reach):
    cell.load(reach)
    assert cell.monitor.arm() == ""
    home = dict(cell.sim.true_joint_positions())
    cell.monitor.check_command(["panda_joint1"], [home["panda_joint1"] + 1.0], cell.now_s())  # a jump: latched
    assert cell.monitor_faulted()
    outcomes = TrialSequence(plan(reach, num_trials=1), cell, clock=cell.now_s).run()
    assert cell.calls[0] == "clear_fault" and outcomes[0].success
    # On hardware the operator checks the cell first: the sequence stops and says so.
    cell.calls.clear()
    assert cell.monitor.arm() == ""
    cell.monitor.check_command(["panda_joint1"], [home["panda_joint1"] + 1.0], cell.now_s())
    with pytest.raises(TrialFailed, match="holds a fault") as failed:
        TrialSequence(plan(reach, simulated=False), cell, clock=cell.now_s).run()
    assert failed.value.code == "ENVELOPE_VIOLATION" and cell.calls == []


def test_operator_declining_and_cancel_end_the_sequence(cell, reach):
    cell.load(reach)
    cell.operator_confirms = False
    with pytest.raises(TrialFailed, match="operator declined the reset: the box fell") as failed:
        TrialSequence(plan(reach, simulated=False), cell, clock=cell.now_s).run()
    assert failed.value.code == "CANCELED" and "run_policy" not in cell.calls
    # Cancelled while trial 0 runs: trial 0 completes, trial 1 never starts.
    sequence = TrialSequence(plan(reach), cell, clock=cell.now_s)
    cell.on_stop_recording = sequence.cancel.set
    with pytest.raises(TrialFailed, match="canceled before trial 1") as failed:
        sequence.run()
    assert failed.value.code == "CANCELED" and [o.index for o in sequence.outcomes] == [0]


def test_a_split_other_than_fit_or_held_out_is_refused(cell, reach):
    with pytest.raises(TrialFailed, match="use 'fit' or 'held_out'") as failed:
        TrialSequence(plan(reach, split="test"), cell).run()
    assert failed.value.code == "WRONG_SPLIT" and cell.calls == []


def test_start_runs_the_sequence_in_a_worker_and_keeps_how_it_ended(cell, reach):
    cell.load(reach)
    cell.recorded_topics = ()
    sequence = TrialSequence(plan(reach, num_trials=1), cell, clock=cell.now_s)
    sequence.start().join(timeout=60.0)
    assert sequence.error is not None and sequence.error.code == "NOT_READY"
    assert np.isfinite(cell.now_s())


def test_a_planned_reset_brings_the_arm_home_through_the_monitor(cell, reach, workcell):
    """planned_reset: after a trial that ended at the reach goal, the next reset moves the
    arm home on the planner's path (twinloop_planning, real OMPL/ruckig), every command
    forwarded by the monitor, no state in contact, the arm within 10 mrad of home before
    the scene is reset."""
    from twinloop_planning.scene import PlanningScene

    cell.load(reach)
    outcomes = TrialSequence(plan(reach, planned_reset=True), cell, clock=cell.now_s).run()
    assert [o.success for o in outcomes] == [True, True]
    assert cell.calls == (["disarm", "move_to_start"] + PER_TRIAL[1:]) * 2
    home = workcell.home_joint_positions
    names = cell.scene.joint_names
    before_reset = cell.reset_path[-1]  # the second reset's end: the first trial left the arm at the goal
    error = max(abs(before_reset[j] - home[j]) for j in names)
    assert error < 0.01, f"{error:.4f} rad from home after the planned reset"
    moved = max(abs(cell.reset_path[0][j] - home[j]) for j in names)
    assert moved > 0.1, moved  # it started away from home (the reach goal: 0.15 and 0.1 rad off)
    assert cell.reset_forwarded > 100 and cell.monitor.state is State.DISARMED
    touching = PlanningScene.from_workcell(workcell)
    assert all(touching.contact([q[j] for j in names], clearance_m=0.0) is None for q in cell.reset_path)


def test_a_reset_that_cannot_be_planned_is_left_to_the_simulator_or_the_operator_with_the_reason(cell, reach,
                                                                                                  workcell):
    from twinloop_planning.scene import PlanningScene, SceneSettings

    cell.load(reach)
    # 0.2 m of clearance: the table is nearer than that to every pose, home included
    cell.scene = PlanningScene.from_workcell(workcell, settings=SceneSettings(clearance_m=0.2))
    outcomes = TrialSequence(plan(reach, num_trials=1, planned_reset=True), cell, clock=cell.now_s).run()
    assert [o.success for o in outcomes] == [True] and "reset_scene" in cell.calls
    outcomes = TrialSequence(plan(reach, num_trials=1, planned_reset=True, simulated=False), cell,
                             clock=cell.now_s).run()
    assert "confirm_reset" in cell.calls
    assert cell.operator_notes[-1].startswith("the arm was not moved to its start pose (no plan (start_invalid)")
    assert cell.operator_notes[-1].endswith("move it there yourself")
