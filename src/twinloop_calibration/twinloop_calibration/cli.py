"""twinloop calibrate: hand-eye calibration live (the running calibration server), from a bag or a data set.

  twinloop calibrate --live --camera static_camera       # a Calibrate goal; see live_cli.py
  twinloop calibrate --bag bags/calib_0001 --camera wrist_camera --setup eye_in_hand
  twinloop calibrate --dataset <industrial_calibration cal_data.yaml> --setup eye_in_hand
  twinloop calibrate --images <folder> --poses <pose file> --target chessboard_9x6 [--intrinsics camera.yaml]

A pose file has one line per image: '<image file> x y z qx qy qz qw' (base_T_gripper) or
'<image file>' and the 16 numbers of the 4x4 row by row; translations in --pose-units
(m or mm); '#' starts a comment. Without --intrinsics they are calibrated from the same views.

Progress lines go to stderr as --live prints them: --dataset per image detected, then the
solve's stages (fitting, held-out folds, bootstrap) with steps done/total, e.g.
"[   14.2 s] held-out folds: 1/5 (15 views)"; --bag those of the solve.

Exit codes: 0 success, 2 bad input or data that cannot give a trustworthy result; with
--live also 3 (the server or monitor not running or not ready), 4 (the run failed) and
130 (cancelled by Ctrl-C), see twinloop_calibration/live_cli.py.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from twinloop_calibration import calibration_io, handeye
from twinloop_calibration.degeneracy import CalibrationError
from twinloop_calibration.targets import TargetConfigError
from twinloop_twin.workcell import WorkcellConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop calibrate", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--live", action="store_true",
                        help="send a Calibrate goal to the running calibration server (the arm moves)")
    source.add_argument("--bag", help="recorded calibration bag (twinloop_logging)")
    source.add_argument("--dataset", help="industrial_calibration cal_data.yaml (image/pose pairs)")
    source.add_argument("--images", help="a folder of images (with --poses)")
    parser.add_argument("--poses", help="--images: the robot pose file, one line per image (see above)")
    parser.add_argument("--pose-units", choices=["m", "mm"], default="m", help="--images: translation units")
    parser.add_argument("--intrinsics", default="",
                        help="--images: a camera_info YAML (default: calibrated from the same views)")
    parser.add_argument("--camera", default="wrist_camera", help="camera name (bag topics /<camera>/color/...)")
    parser.add_argument("--setup", choices=[s.value for s in handeye.Setup], default=None,
                        help="default: eye_in_hand (bag, dataset); with --live from the camera's mount")
    parser.add_argument("--views", type=int, default=0, help="--live: views to plan (0: the server's default)")
    parser.add_argument("--server", default="/calibration_server", help="--live: node name of the server")
    parser.add_argument("--target", default="", help="target name in config/calibration_targets.yaml (bags, images)")
    parser.add_argument("--gripper-frame", default="panda_hand")
    parser.add_argument("--bootstrap", type=int, default=30, help="bootstrap resamples (0: none)")
    parser.add_argument("--max-translation-std-m", type=float, default=handeye.MAX_TRANSLATION_STD_M,
                        help="refuse a result less certain than this, 1 sigma (default %(default)s m)")
    parser.add_argument("--max-rotation-std-deg", type=float, default=handeye.MAX_ROTATION_STD_DEG,
                        help="(default %(default)s deg)")
    parser.add_argument("--correct-scale", action="store_true",
                        help="when the robot's motion shows the target's scale (or the focal length) is off, "
                             "return the solution with the scale corrected, reported as such")
    parser.add_argument("--output", help="write the calibration YAML here")
    args = parser.parse_args(argv)
    if args.live:
        from twinloop_calibration import live_cli
        return live_cli.run(args)
    args.setup = args.setup or "eye_in_hand"
    problem = _check_options(args)
    if problem:
        print(f"twinloop calibrate: error: {problem}", file=sys.stderr)
        return 2
    options = handeye.Options(bootstrap=args.bootstrap, max_translation_std_m=args.max_translation_std_m,
                              max_rotation_std_deg=args.max_rotation_std_deg, correct_scale=args.correct_scale)
    offset, spacing = None, None
    progress = _Progress()
    try:
        if args.dataset:
            from twinloop_calibration.datasets import load_industrial_calibration
            data = load_industrial_calibration(args.dataset, progress=progress)
            if data.not_found:
                print(f"target not found in {data.not_found}", file=sys.stderr)
            views, camera, spacing = data.views, data.camera, data.target.spacing_m
        elif args.images:
            data = _folder(args, progress)
            if data.not_found:
                print(f"target not found in {data.not_found}", file=sys.stderr)
            if not args.intrinsics:
                print(f"intrinsics calibrated from the same views: fx {data.camera.camera_matrix[0, 0]:.2f} "
                      f"fy {data.camera.camera_matrix[1, 1]:.2f} cx {data.camera.camera_matrix[0, 2]:.2f} "
                      f"cy {data.camera.camera_matrix[1, 2]:.2f} px, RMS {data.camera.reprojection_rms_px:.3f} px",
                      file=sys.stderr)
            views, camera, spacing = data.views, data.camera, data.target.spacing_m
        else:
            views, camera, offset, spacing = _bag(args)
        progress.views = len(views)
        result = handeye.calibrate(args.setup, views, camera, options, progress=progress)
    except (CalibrationError, TargetConfigError, WorkcellConfigError, OSError) as error:
        print(f"twinloop calibrate: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(calibration_io.report(result, time_offset=offset, target_spacing_m=spacing))
    if args.output:
        document = calibration_io.calibration_document(
            result, camera_name=args.camera, parent_frame=args.gripper_frame if args.setup == "eye_in_hand" else "world",
            child_frame=f"{args.camera}_color_optical_frame_calibrated", camera=camera,
            source=_source(args),
            time_offset=offset)
        print(f"written: {calibration_io.write_calibration(args.output, document)}")
    return 0


class _Progress:
    """Progress lines on stderr with the elapsed time, as `--live` prints them:
    '[  12.3 s] bootstrap: 10/30 (15 views)'."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.views = 0  # views in use, once known

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in ("fitting", "refitting without outliers"):
            text = f"{stage}: {total} views"
        else:
            text = f"{stage}: {done}/{total}" + (f" ({self.views} views)" if self.views else "")
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)


def _source(args) -> dict:
    if args.images:
        return {"mode": "images", "path": str(Path(args.images).resolve()), "poses": str(Path(args.poses).resolve()),
                "pose_units": args.pose_units,
                "intrinsics": str(Path(args.intrinsics).resolve()) if args.intrinsics else "calibrated"}
    return {"mode": "bag" if args.bag else "dataset", "path": str(Path(args.bag or args.dataset).resolve())}


def _folder(args, progress):
    from twinloop_calibration.datasets import load_camera_info_yaml, load_folder
    from twinloop_calibration.targets import load_targets
    from twinloop_twin.workcell import default_config_dir

    targets, default = load_targets(default_config_dir() / "calibration_targets.yaml")
    if (args.target or default) not in targets:
        raise TargetConfigError(f"unknown target '{args.target}'; known: {sorted(targets)}")
    camera = load_camera_info_yaml(args.intrinsics) if args.intrinsics else None
    return load_folder(args.images, args.poses, targets[args.target or default], camera=camera,
                       pose_units=args.pose_units, progress=progress)


def _check_options(args) -> str:
    """What is wrong with the numeric options or the output, before any work; '' if nothing."""
    if args.images and not args.poses:
        return "--images needs --poses: the robot pose file, one line per image"
    if args.poses and not args.images:
        return "--poses goes with --images (a folder of images)"
    if args.bootstrap < 0:
        return f"--bootstrap must be >= 0 (0: no bootstrap), got {args.bootstrap}"
    for name in ("max_translation_std_m", "max_rotation_std_deg"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            return f"--{name.replace('_', '-')} must be a finite number > 0, got {value}"
    if args.output and (Path(args.output).exists() or Path(args.output).is_symlink()):
        return f"{args.output} exists already; a calibration is never overwritten: give another --output"
    return ""


def _bag(args):
    from twinloop_calibration.sources import views_from_bag
    from twinloop_calibration.targets import TargetDetector, load_targets
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.physics import ARM_JOINTS
    from twinloop_twin.workcell import default_config_dir, load_workcell

    targets, default = load_targets(default_config_dir() / "calibration_targets.yaml")
    if (args.target or default) not in targets:
        raise TargetConfigError(f"unknown target '{args.target}'; known: {sorted(targets)}")
    kinematics = UrdfTransforms(load_workcell().urdf_xml)

    def forward(q):
        return kinematics.world_T_link(args.gripper_frame, dict(zip(ARM_JOINTS, q)))

    target = targets[args.target or default]
    bag = views_from_bag(args.bag, camera_name=args.camera, detector=TargetDetector(target),
                         joint_names=list(ARM_JOINTS), forward_kinematics=forward, setup=args.setup)
    return bag.views, bag.camera, bag.time_offset, target.spacing_m


if __name__ == "__main__":
    sys.exit(main())
