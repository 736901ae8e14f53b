"""A trained carry policy through the real policy runner over DDS: the emulated workcell
with its cameras (config/emulated_truth.yaml), the box tracker on the static camera, the
envelope monitor and the runner as their own processes. One trial of `~/run_trials`:
the box ends within the goal radius, the monitor never faults and forwards every command
unchanged."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml
from geometry_msgs.msg import PoseStamped, PoseWithCovarianceStamped
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode

from twinloop_policy.carry import CarryPolicy, plan_carry
from twinloop_policy.export import export_policy
from twinloop_policy.rollouts import CarryRollouts
from twinloop_policy.task import load_task_config
from twinloop_policy.training import train
from twinloop_policy.variation import make_variation
from twinloop_ros.qos import STREAM
from twinloop_ros.testing import RELIABLE, EnvelopeCell, NodeProcess, stamp_s
from twinloop_twin.nominal import physics_parameters
from twinloop_twin.parameters import Parameter, ParameterSet
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import compile_workcell
from twinloop_twin.workcell import default_config_dir, load_workcell

pytestmark = pytest.mark.ros
CONFIG = default_config_dir()


def _trained_policy(folder):
    """A short posterior training in a twin identified from the emulated truth (3 % stds), exported."""
    shipped = load_task_config()
    task = dataclasses.replace(shipped, training=dataclasses.replace(
        shipped.training, contexts=2, physics_per_candidate=6, cem_population=6, cem_iterations=2,
        evaluation_episodes=8))
    workcell = load_workcell()
    nominal = load_physics(CONFIG / "nominal_physics.yaml")
    prior = physics_parameters(nominal, source="nominal")
    means = physics_parameters(load_physics(CONFIG / "emulated_truth.yaml"), source="identified").means()
    twin = ParameterSet({n: Parameter(means[n], 0.03 * means[n], True, prior[n].unit, "identified") for n in prior})
    model = compile_workcell(workcell, nominal)
    plan = plan_carry(task, workcell, model)
    rollouts = CarryRollouts(model, CarryPolicy(plan, task), task, workcell.box.link, plan.box_z_m, workers=2)
    result = train(task, rollouts, make_variation("posterior", task, twin))
    return export_policy(folder, result, task, twin="emulated/v1", twin_sha256="0" * 64)


def test_trained_carry_policy_runs_in_the_runner_through_the_monitor(tmp_path):
    spec = _trained_policy(tmp_path / "carry")
    shipped = yaml.safe_load((CONFIG / "box_tracker.yaml").read_text())["/**/box_tracker"]["ros__parameters"]
    tracker_parameters = {k: v for k, v in shipped.items() if v != ""}  # "": the node's own default
    cell = EnvelopeCell(tmp_path, {"command_timeout_s": 0.5, "joint_state_timeout_s": 0.5},
                        workcell_parameters={"cameras_enabled": True})
    try:
        tracker = NodeProcess("twinloop_perception.box_tracker_node", cell.domain_id, tracker_parameters,
                              log_path=tmp_path / "tracker.log")
        runner = NodeProcess("twinloop_policy.policy_runner_node", cell.domain_id,
                             {"twin_version": "emulated/v1", "settle_s": 0.5}, log_path=tmp_path / "runner.log")
        cell.extra += [tracker, runner]
        tracked = cell.probe.collect(PoseWithCovarianceStamped, "/twinloop/perception/box_pose", RELIABLE)
        truth = cell.probe.collect(PoseStamped, "/twinloop/emulated_workcell/box_pose", STREAM)
        policy_commands = cell.probe.collect(JointState, "/twinloop/policy/command", RELIABLE)
        cell.probe.wait_for(lambda: len(tracked) >= 3, 90.0, "the tracker's first poses")
        result = cell.run_trials(str(spec.folder), record=False, runner_log=runner.log)
        assert result.error.code == ErrorCode.NONE, result.error.message + runner.log()
        (outcome,) = result.outcomes
        box = truth[-1][1].pose.position
        distance = float(np.hypot(box.x - spec.goal_box_xy[0], box.y - spec.goal_box_xy[1]))
        print(f"trial: {outcome.reason}, {outcome.duration_s:.1f} s; the box (ground truth) {distance * 100:.1f} cm "
              f"from the goal; {len(tracked)} tracked poses")
        assert outcome.success, outcome.reason + runner.log()[-3000:]
        assert distance <= spec.goal_radius_m
        assert all(s.state != EnvelopeStatus.STATE_FAULT for _, s in list(cell.status)), cell.monitor.log()[-3000:]
        out = {stamp_s(m.header.stamp): list(m.position) for _, m in cell.hardware_commands
               if m.header.frame_id == ""}
        sent_commands = [(stamp_s(m.header.stamp), list(m.position)) for _, m in policy_commands]
        assert len(sent_commands) > 1500  # ~9 s at 250 Hz
        assert all(out.get(t) == p for t, p in sent_commands), "a policy command was changed or dropped"
    finally:
        cell.close()
