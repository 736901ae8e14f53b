"""Benchmark: the box tracker's cost and latency, measured in one run.

    .venv/bin/python bench/box_tracking.py [--window-s 10]

1. In-process, on static-camera frames of the emulated cell rendered with the truth's
   noise (the box at rest, then the arm over it at its push pose): the tracker's time per
   frame against the frame period (goal: well under it) and against the render of the same
   frame.
2. Live: the emulated workcell and the box tracker node as their own processes (the
   README's way), the node's status over a window: frames tracked per second against the
   cameras' rate, latency from image stamp to publish (goal <= 50 ms; the emulated
   camera's render is inside it) and the tracker's own processing time.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
from geometry_msgs.msg import PoseWithCovarianceStamped  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from twinloop_interfaces.msg import SystemStatus  # noqa: E402

from twinloop_perception.box_tracking import BoxTracker, BoxTrackerSettings, Pinhole  # noqa: E402
from twinloop_perception.camera_pose import world_T_camera  # noqa: E402
from twinloop_ros.qos import IMAGES, LATCHED, RELIABLE  # noqa: E402
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id  # noqa: E402
from twinloop_sim.workcell_sim import CameraRig, WorkcellSimulation  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

FRAME_RATE_HZ = 15.0


def in_process(frames: int) -> tuple[float, float]:
    """(median tracker s per frame, median render s per frame)."""
    workcell = load_workcell()
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    sim = WorkcellSimulation(workcell, truth)
    camera = workcell.cameras["static_camera"]
    rig = CameraRig(sim.model, {"static_camera": camera}, truth.noise, seed=1)
    tracker = BoxTracker(BoxTrackerSettings(size_m=tuple(workcell.box.size_m),
                                            table_height_m=workcell.table_top_height_m),
                         Pinhole(camera.width, camera.height, camera.fx, camera.fy, camera.cx, camera.cy),
                         world_T_camera(workcell, "static_camera"))
    track_s, render_s = [], []
    for _ in range(frames):
        start = time.perf_counter()
        rig.set_state(sim.data.qpos)
        rgb, depth = rig.render("static_camera")
        render_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        estimate = tracker.update(rgb, depth)
        track_s.append(time.perf_counter() - start)
        assert estimate.found, estimate.reason
    rig.close()
    return float(np.median(track_s)), float(np.median(render_s))


def live(window_s: float) -> dict[str, float]:
    domain = fresh_domain_id()
    config = default_config_dir()
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain,
                           extra_args=["--params-file", str(config / "emulated_workcell.yaml")])
    tracker = NodeProcess("twinloop_perception.box_tracker_node", domain,
                          extra_args=["--params-file", str(config / "box_tracker.yaml")])
    probe = RosProbe(domain)
    try:
        poses = probe.collect(PoseWithCovarianceStamped, "/twinloop/perception/box_pose", RELIABLE)
        frames = probe.collect(Image, "/static_camera/depth/image_rect_raw", IMAGES)
        status = probe.collect(SystemStatus, "/box_tracker/status", LATCHED)
        probe.wait_for(lambda: len(poses) > 10, 90.0, "tracked poses")
        time.sleep(2.0)
        poses0, frames0 = len(poses), len(frames)
        time.sleep(window_s)
        values = {kv.key: float(kv.value) for kv in status[-1][1].values}
        values["poses_per_s"] = (len(poses) - poses0) / window_s
        values["frames_per_s"] = (len(frames) - frames0) / window_s
    finally:
        probe.close()
        tracker.stop()
        workcell.stop()
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=60)
    args = parser.parse_args()
    track_s, render_s = in_process(args.frames)
    period_s = 1.0 / FRAME_RATE_HZ
    print(f"in-process: tracker {track_s * 1e3:.1f} ms per frame = {track_s / period_s:.2f} of the "
          f"{period_s * 1e3:.0f} ms frame period; {track_s / render_s:.2f}x the render of the same frame "
          f"({render_s * 1e3:.1f} ms)")
    values = live(args.window_s)
    print(f"live node: {values['poses_per_s']:.1f} poses/s for {values['frames_per_s']:.1f} camera frames/s "
          f"(ratio {values['poses_per_s'] / max(values['frames_per_s'], 1e-9):.2f}); latency image stamp -> publish "
          f"median {values['latency_ms_median']:.1f} ms, p95 {values['latency_ms_p95']:.1f} ms "
          f"({values['latency_ms_median'] / 50.0:.2f}x the 50 ms goal); the tracker's own processing "
          f"{values['processing_ms_median']:.1f} ms")


if __name__ == "__main__":
    main()
