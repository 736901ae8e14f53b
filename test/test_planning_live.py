"""A planned move on the emulated cell through the envelope monitor, around a keep-out column
the monitor enforces (the monitor and the planner read the same envelope file).

The straight move between the two poses is faulted by the monitor (its hand would enter the
column); `twinloop plan move` between them runs to the goal with no fault, and every joint
state measured while it moved is inside the position limits, in no collision and with
every checked link outside the column. Real nodes over DDS on a private domain.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from twinloop_interfaces.msg import EnvelopeStatus

from twinloop_planning.scene import PlanningScene
from twinloop_ros.testing import EnvelopeCell, localhost_env
from twinloop_twin.motion import minimum_jerk
from twinloop_twin.workcell import load_workcell

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "twinloop_planning" / "test"))
from test_planner import COLUMN, LEFT, RIGHT, envelope_with_column  # noqa: E402

pytestmark = pytest.mark.ros
TWINLOOP = str(Path(sys.executable).parent / "twinloop")
JOINTS = [f"panda_joint{i}" for i in range(1, 8)] + ["panda_finger_joint1"]


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planning_live")
    envelope = envelope_with_column(tmp)
    section = yaml.safe_load(envelope.read_text())["/**/envelope_monitor"]["ros__parameters"]
    cell = EnvelopeCell(tmp, {"keep_out_boxes": section["keep_out_boxes"], "keep_out_names": section["keep_out_names"],
                              "command_timeout_s": 0.5, "joint_state_timeout_s": 0.5})
    cell.envelope = envelope
    yield cell
    cell.close()


def put_at(cell: EnvelopeCell, q: np.ndarray) -> None:
    """Disarmed, no fault, the robot at q."""
    cell.stop_ramps()
    cell.reset_fault()
    cell.set_armed(False)
    cell.reset_workcell(dict(zip(JOINTS, q.tolist())))
    time.sleep(0.5)


def test_the_straight_move_faults_and_the_planned_one_goes_around(cell):
    put_at(cell, LEFT)
    # The straight minimum-jerk move, streamed as a policy would: the monitor faults it.
    assert cell.set_armed(True).error.code == 0
    period, duration = 0.004, 3.0
    begin = time.monotonic()
    for k in range(1, int(duration / period) + 1):
        cell.command(dict(zip(JOINTS, minimum_jerk(LEFT, RIGHT, duration, k * period).tolist())))
        if cell.latest_status().state == EnvelopeStatus.STATE_FAULT:
            break
        time.sleep(max(0.0, begin + k * period - time.monotonic()))
    fault = cell.wait_for_fault()
    assert fault.fault == EnvelopeStatus.FAULT_KEEP_OUT and "column" in fault.reason, fault

    put_at(cell, LEFT)
    status_count = len(cell.status)
    started = time.monotonic()
    measured_from = len(cell.joint_states)
    to = ",".join(f"{v:g}" for v in RIGHT[:7])
    done = subprocess.run([TWINLOOP, "plan", "move", f"--to={to}", "--envelope", str(cell.envelope)],
                          env=localhost_env(cell.domain_id), capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0 and done.stdout.startswith("reached"), done.stderr
    assert "sampled around obstacles" in done.stderr
    faults = [s for _, s in cell.status[status_count:] if s.state == EnvelopeStatus.STATE_FAULT]
    assert not faults, faults[0].reason

    scene = PlanningScene.from_workcell(load_workcell(), cell.envelope)
    states = [positions for _, (_, positions) in cell.joint_states[measured_from:]]
    assert len(states) > 250 * (time.monotonic() - started) * 0.3  # the move was watched throughout
    column_min, column_max = np.array(COLUMN[:3]), np.array(COLUMN[3:])
    for positions in states[::5]:
        q = np.array([positions[j] for j in JOINTS])
        arm = slice(0, 7)  # the gripper's measured value may read a hair beyond its limit
        assert np.all(q[arm] >= scene.lower[arm] - 1e-3) and np.all(q[arm] <= scene.upper[arm] + 1e-3), q
        q = np.clip(q, scene.lower, scene.upper)
        assert scene.contact(q, clearance_m=0.0) is None, q
        links = scene.link_positions(q)
        assert not np.any(np.all((links >= column_min) & (links <= column_max), axis=1)), q
    reached = np.array([states[-1][j] for j in JOINTS[:7]])
    assert np.max(np.abs(reached - RIGHT[:7])) < 0.01
