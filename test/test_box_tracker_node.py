"""The box tracker node on the emulated workcell, started as the README says.

The README's two commands run as written (each in its own shell, on this test's
ROS_DOMAIN_ID, DDS on localhost); the test compares the published poses with the
emulated cell's ground-truth topic, frame by frame (nearest stamps: the image's time is the
physics time the frame shows), and reads the node's status. The moving, occluded box is
scored in-process by test_box_tracking.py.
"""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from geometry_msgs.msg import PoseStamped, PoseWithCovarianceStamped
from twinloop_interfaces.msg import SystemStatus

from twinloop_ros.qos import LATCHED, RELIABLE, STREAM
from twinloop_ros.testing import RosProbe, fresh_domain_id
from twinloop_ros.process import interrupt_group, localhost_env

pytestmark = pytest.mark.ros

ROOT = Path(__file__).resolve().parents[1]
README_WORKCELL = "tools/in_env.sh emulated_workcell --ros-args --params-file config/emulated_workcell.yaml"
README_TRACKER = "tools/in_env.sh box_tracker --ros-args --params-file config/box_tracker.yaml"


def _start(command: str, domain: int, log: Path) -> subprocess.Popen:
    assert command in (ROOT / "README.md").read_text(), f"the README no longer shows `{command}`"
    return subprocess.Popen(command, shell=True, cwd=ROOT, env=localhost_env(domain), start_new_session=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen) -> None:
    interrupt_group(process, timeout_s=15)


def _seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def test_tracked_pose_matches_ground_truth_at_the_same_stamps(tmp_path):
    domain = fresh_domain_id()
    workcell = _start(README_WORKCELL, domain, tmp_path / "workcell.log")
    tracker = _start(README_TRACKER, domain, tmp_path / "tracker.log")
    probe = RosProbe(domain)
    try:
        tracked = probe.collect(PoseWithCovarianceStamped, "/twinloop/perception/box_pose", RELIABLE)
        truth = probe.collect(PoseStamped, "/twinloop/emulated_workcell/box_pose", STREAM)
        status = probe.collect(SystemStatus, "/box_tracker/status", LATCHED)
        probe.wait_for(lambda: len(tracked) >= 5, 90.0, "the tracker's first poses")
        start = len(tracked)
        # 60 more: the ground truth comes best effort and a loaded host drops some of it
        # (a fresh-clone run paired only 13 of 25 poses with a truth within 11 ms)
        probe.wait_for(lambda: len(tracked) >= start + 60, 45.0, "60 more tracked poses")
        pairs = []
        truth_s = np.array([_seconds(m.header.stamp) for _, m in list(truth)])
        for _, msg in list(tracked)[start + 5:]:
            nearest = int(np.argmin(np.abs(truth_s - _seconds(msg.header.stamp))))
            ground = truth[nearest][1]
            if abs(truth_s[nearest] - _seconds(msg.header.stamp)) <= 0.011:  # truth at 50 Hz, frames at 15 Hz
                p, g = msg.pose.pose.position, ground.pose.position
                pairs.append((np.array([p.x, p.y, p.z]), np.array([g.x, g.y, g.z]),
                              np.array(msg.pose.covariance).reshape(6, 6)))
        probe.wait_for(lambda: status and status[-1][1].level == SystemStatus.LEVEL_OK, 10.0, "an OK status")
        values = {kv.key: kv.value for kv in status[-1][1].values}
    finally:
        probe.close()
        _stop(tracker)
        _stop(workcell)
    assert len(pairs) >= 20, f"{len(pairs)} tracked poses have a ground-truth pose within 11 ms"
    errors_mm = np.array([np.linalg.norm(p - g) * 1e3 for p, g, _ in pairs])
    print(f"{len(pairs)} poses: error median {np.median(errors_mm):.2f} mm, max {errors_mm.max():.2f} mm; "
          f"status {values}")
    assert np.median(errors_mm) <= 1.0 and errors_mm.max() <= 3.0
    assert all(np.all(np.linalg.eigvalsh(c) > 0) for *_, c in pairs)  # a covariance, positive definite
    assert int(values["frames_found"]) >= 30 and math.isfinite(float(values["latency_ms_median"]))
    assert float(values["processing_ms_median"]) < float(values["latency_ms_median"])
