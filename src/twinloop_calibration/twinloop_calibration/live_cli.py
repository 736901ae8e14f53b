"""`twinloop calibrate --live`: a Calibrate goal to the running calibration server.

    twinloop calibrate --live --camera static_camera [--setup eye_to_hand] [--views 12]

The server plans views of the cell's calibration target, drives the arm there through the
envelope monitor (arming it for the run), pairs images with joint states, solves, writes
`<calibration_root>/<workcell>/<camera>.yaml` and publishes the result on /tf_static.
Progress lines show the stage and the views collected; the end prints the transform, its
uncertainty and residuals. Without --setup the camera's mount decides it: a camera that
moves with the arm in the workcell URDF is eye_in_hand, any other eye_to_hand. Ctrl-C
cancels the goal (the server stops at its next view and disarms the monitor).

Exit codes (those of `twinloop calibrate`, plus the live ones): 0 done; 2 bad input or
data that cannot give a trustworthy result (unknown camera, too few views, degenerate
views); 3 the calibration server or the envelope monitor is not running on this
ROS_DOMAIN_ID or not ready (no joint states, no images); 4 the run failed (e.g. the
monitor faulted; the message says why); 130 cancelled by Ctrl-C.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from twinloop_ros.clients import CalibrationClient
from twinloop_ros.command_line import CANCEL_WAIT, EXIT_BAD_INPUT, Progress, run_live

PROG = "twinloop calibrate"


def camera_setup(camera: str) -> str:
    """eye_in_hand when the camera's optical frame hangs below a moving joint in the
    workcell URDF, eye_to_hand otherwise; ValueError for a camera the workcell lacks."""
    from twinloop_twin.kinematics import MOVING_TYPES, UrdfTransforms
    from twinloop_twin.workcell import load_workcell

    workcell = load_workcell()
    if camera not in workcell.cameras:
        raise ValueError(f"the workcell has no camera '{camera}'; its cameras: {', '.join(sorted(workcell.cameras))}")
    parent_joint = {j.child: j for j in UrdfTransforms(workcell.urdf_xml).joints}
    link = workcell.cameras[camera].color_optical_frame
    while link in parent_joint:
        joint = parent_joint[link]
        if joint.type in MOVING_TYPES:
            return "eye_in_hand"
        link = joint.parent
    return "eye_to_hand"


def run(args) -> int:
    """`args`: the parsed `twinloop calibrate` arguments (camera, setup, views, calibration server)."""
    if args.views < 0:
        print(f"{PROG}: --views {args.views}: give a number of views (0: the server's default)", file=sys.stderr)
        return EXIT_BAD_INPUT
    setup = args.setup
    if not setup:
        try:
            setup = camera_setup(args.camera)
        except ValueError as error:
            print(f"{PROG}: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT

    def feedback(f) -> None:
        residual = f"; residual {f.current_residual_px:.2f} px" if math.isfinite(f.current_residual_px) else ""
        progress(f"{f.stage}: {f.views_collected}/{f.views_planned} views{residual}")

    def body(session) -> int:
        print(f"calibrating {args.camera} ({setup}) live; the arm moves through the envelope monitor", flush=True)
        result = CalibrationClient(session.node, server=args.server).live(
            args.camera, setup, num_views=args.views, on_feedback=feedback,
            cancel_wait_s=60.0, on_cancel=lambda: progress(CANCEL_WAIT.format(node="the calibration server")))
        t = result.transform.transform
        std = np.sqrt(np.clip(np.diag(np.array(result.covariance).reshape(6, 6)), 0.0, None))
        print(f"{result.transform.header.frame_id}_T_{result.transform.child_frame_id}: "
              f"xyz [{t.translation.x:.4f}, {t.translation.y:.4f}, {t.translation.z:.4f}] m, "
              f"xyzw [{t.rotation.x:.5f}, {t.rotation.y:.5f}, {t.rotation.z:.5f}, {t.rotation.w:.5f}]")
        print(f"std (1 sigma): translation {np.linalg.norm(std[:3]) * 1e3:.2f} mm, "
              f"rotation {math.degrees(np.linalg.norm(std[3:])):.3f} deg")
        print(f"reprojection RMS {result.reprojection_rms_px:.3f} px, held-out RMS {result.held_out_rms_px:.3f} px; "
              f"{result.views_used} views used, {result.views_rejected} rejected")
        mount = _from_described_mount(args.camera, result.transform)
        if mount:
            print(mount)
        print(f"written: {result.calibration_path}")
        return 0

    progress = Progress()
    return run_live(PROG, body)



def _from_described_mount(camera: str, stamped) -> str:
    """How far the calibrated camera is from the mount the robot description gives it, in
    one line ('' where the description has no such camera or frame)."""
    from twinloop_calibration import se3
    from twinloop_calibration.calibration_io import from_described_mount
    from twinloop_twin.workcell import WorkcellConfigError

    t, q = stamped.transform.translation, stamped.transform.rotation
    calibrated = se3.from_xyz_quat(np.array([t.x, t.y, t.z]), np.array([q.x, q.y, q.z, q.w]))
    try:
        distance = from_described_mount(camera, stamped.header.frame_id, calibrated)
    except WorkcellConfigError:
        return ""
    if distance is None:
        return ""
    translation_m, rotation_rad = distance
    return (f"from the described (URDF) mount: {translation_m * 1e3:.2f} mm, {math.degrees(rotation_rad):.3f} deg "
            f"({stamped.header.frame_id} -> {camera}'s optical frame)")
