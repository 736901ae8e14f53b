"""Does the static camera's reported covariance cover its error? Live runs on the emulated cell.

Each run starts the emulated workcell (its own seed: sensor noise, rendered images), the
envelope monitor and the calibration server with the shipped parameter files on a private
localhost domain, calibrates the static camera live (eye-to-hand, through the table's
board) and compares the result with the camera's mount in the URDF (the truth here). It
prints per run the translation error, the reported 1-sigma and the squared Mahalanobis
distance of the translation error under the reported covariance (3 dof: 95 % of runs
should stay under 7.81), then the fraction of runs inside it. ~1 min a run on 2 cores.

  python bench/calibration_coverage.py --runs 5
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rclpy.action import ActionClient
from twinloop_interfaces.action import Calibrate
from twinloop_interfaces.msg import ErrorCode

from twinloop_calibration import se3
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import default_config_dir, load_workcell

CHI2_3DOF_95 = 7.815


def one_run(seed: int, folder: Path) -> tuple[float, float, float]:
    """(translation error m, reported 1-sigma m, Mahalanobis^2) of one live static calibration."""
    domain, config = fresh_domain_id(), default_config_dir()
    nodes = [NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"seed": seed},
                         log_path=folder / "workcell.log",
                         extra_args=["--params-file", str(config / "emulated_workcell.yaml")]),
             NodeProcess("twinloop_safety.envelope_monitor_node", domain, log_path=folder / "monitor.log",
                         extra_args=["--params-file", str(config / "envelope.yaml")]),
             NodeProcess("twinloop_calibration.calibration_server_node", domain,
                         {"calibration_root": str(folder)}, log_path=folder / "server.log",
                         extra_args=["--params-file", str(config / "calibration.yaml")])]
    probe = RosProbe(domain)
    try:
        client = ActionClient(probe.node, Calibrate, "/calibration_server/calibrate")
        if not client.wait_for_server(timeout_sec=60.0):
            raise RuntimeError(f"the calibration server did not come up; see {folder}/server.log")
        sent = client.send_goal_async(Calibrate.Goal(source="live", camera="static_camera", setup="eye_to_hand"))
        probe.wait_for(sent.done, 10.0, "goal acceptance")
        done = sent.result().get_result_async()
        probe.wait_for(done.done, 300.0, "calibration result")
        result = done.result().result
        if result.error.code != ErrorCode.NONE:
            raise RuntimeError(f"calibration failed: {result.error.message}")
    finally:
        probe.close()
        for node in reversed(nodes):
            node.stop()
    workcell = load_workcell()
    truth = UrdfTransforms(workcell.urdf_xml).world_T_link("static_camera_color_optical_frame",
                                                           workcell.home_joint_positions)
    t = result.transform.transform
    estimate = se3.from_xyz_quat([t.translation.x, t.translation.y, t.translation.z],
                                 [t.rotation.x, t.rotation.y, t.rotation.z, t.rotation.w])
    covariance = np.array(result.covariance).reshape(6, 6)
    d = se3.difference(estimate, truth)[:3]
    return (float(np.linalg.norm(d)), float(math.sqrt(np.trace(covariance[:3, :3]))),
            float(d @ np.linalg.solve(covariance[:3, :3], d)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="calibration_coverage_") as work:
        for seed in range(args.first_seed, args.first_seed + args.runs):
            folder = Path(work) / f"seed{seed}"
            folder.mkdir()
            started = time.monotonic()
            error_m, sigma_m, mahalanobis2 = one_run(seed, folder)
            rows.append(mahalanobis2)
            print(f"seed {seed}: error {error_m * 1e3:.2f} mm, reported 1-sigma {sigma_m * 1e3:.2f} mm, "
                  f"Mahalanobis^2 {mahalanobis2:.1f} (3 dof, 95 %: {CHI2_3DOF_95}), {time.monotonic() - started:.0f} s",
                  flush=True)
    inside = sum(m <= CHI2_3DOF_95 for m in rows)
    print(f"coverage: {inside} of {len(rows)} runs inside the 95 % ellipsoid (expected ~{0.95 * len(rows):.1f}); "
          f"median Mahalanobis^2 {np.median(rows):.1f} (expected 2.4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
