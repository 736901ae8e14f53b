"""Hand-eye accuracy: twinloop_calibration vs OpenCV's methods on the same synthetic views.

Sweeps pixel noise and robot pose noise over seeds and view counts; for each setting
prints the median translation and rotation error of our result (as shipped: refinement,
noise model, k-fold choice) and of every OpenCV method computed from the same data in the
same run, and the ratio of ours to the best OpenCV method. Goal: ratio <= 0.7 at realistic
noise (0.5 px, 0.5 mm / 0.05 deg).

  python bench/handeye_accuracy.py            # full sweep, ~10 min on 2 cores
  python bench/handeye_accuracy.py --quick    # realistic noise only
  python bench/handeye_accuracy.py --real     # the real 10x10 set and a 28-view chessboard-sized solve

--real: on ../shared/data/handeye_ros_industrial_10x10 (15 views), with the data set's
nominal intrinsics and with intrinsics calibrated from the same views, the leave-one-out
base->target consistency of ours and of every OpenCV method: each view left out in turn,
the hand-eye transform and the target pose solved from the other views, and the left-out
view's base_T_target (robot pose . X . PnP) compared with the solved one (RMS over the
views, translation mm and rotation deg), the wall time per solve, and our target-scale
check; `--correct-scale` is scored with the left-out view's PnP on the target at the scale
the result found (the corrected description a user would then use). Then the wall time of one calibration (defaults, analytic covariance; and with a
30-resample bootstrap) on 28 synthetic views of a 24x17-corner chessboard, the size of a
typical real set, side by side with OpenCV's methods on the same views.
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import time

import numpy as np

from pathlib import Path

from twinloop_calibration import handeye, se3, synthetic
from twinloop_calibration.degeneracy import CalibrationError
from twinloop_calibration.intrinsics import CameraModel, calibrate_intrinsics, solve_pnp
from twinloop_calibration.targets import Detection, TargetSpec

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "handeye_ros_industrial_10x10" / "cal_data.yaml"

OPENCV = ("tsai", "park", "horaud", "andreff", "daniilidis", "rwhe_shah", "rwhe_li")


def one(job):
    setup, pixel, translation_mm, rotation_deg, views, seed = job
    generate = getattr(synthetic, setup)
    data = generate(views=views, seed=seed, pixel_std=pixel, robot_translation_std_m=translation_mm * 1e-3,
                    robot_rotation_std_rad=math.radians(rotation_deg))
    try:
        result = handeye.calibrate(setup, data.views, data.camera,
                                   handeye.Options(folds=5, max_translation_std_m=1.0, max_rotation_std_deg=90.0))
    except CalibrationError as error:
        return job, None, str(error)
    errors = {"twinloop": se3.errors(result.transform, data.x_true)}
    for name, x in result.opencv.items():
        errors[name] = se3.errors(x, data.x_true)
    return job, errors, result.method


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--setup", default="eye_in_hand", choices=["eye_in_hand", "eye_to_hand"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--real", action="store_true", help="the real set and the 28-view timing (see above)")
    args = parser.parse_args()
    if args.real:
        real()
        return
    if args.quick:
        settings = [(0.5, 0.5, 0.05, 15)]
    else:
        settings = [(p, t, r, 15) for p in (0.1, 0.5, 1.0) for t, r in ((0.1, 0.01), (0.5, 0.05), (1.0, 0.1))]
        settings += [(0.5, 0.5, 0.05, 10), (0.5, 0.5, 0.05, 30)]
    jobs = [(args.setup, *s, 1000 + seed) for s in settings for seed in range(args.seeds)]
    started = time.time()
    with multiprocessing.Pool(args.processes) as pool:
        outcomes = pool.map(one, jobs)
    by_setting: dict[tuple, list] = {}
    failures = 0
    methods_chosen: dict[str, int] = {}
    for job, errors, method in outcomes:
        if errors is None:
            failures += 1
            continue
        by_setting.setdefault(job[1:5], []).append(errors)
        methods_chosen[method] = methods_chosen.get(method, 0) + 1
    print(f"{args.setup}, {args.seeds} seeds per setting, {time.time() - started:.0f} s; refused: {failures}; "
          f"chosen: {methods_chosen}")
    header = "| pixel px | robot mm / deg | views | twinloop mm / deg | " + " | ".join(OPENCV) + " | ratio t / r vs best OpenCV |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    goal = None
    for setting, runs in by_setting.items():
        pixel, t_mm, r_deg, views = setting
        medians = {}
        for name in ("twinloop", *OPENCV):
            values = np.array([r[name] for r in runs if name in r])
            if len(values):
                medians[name] = (np.median(values[:, 0]) * 1e3, math.degrees(np.median(values[:, 1])))
        best_t = min(medians[n][0] for n in OPENCV if n in medians)
        best_r = min(medians[n][1] for n in OPENCV if n in medians)
        ratio = (medians["twinloop"][0] / best_t, medians["twinloop"][1] / best_r)
        cells = " | ".join(f"{medians[n][0]:.2f} / {medians[n][1]:.3f}" if n in medians else "-" for n in OPENCV)
        print(f"| {pixel} | {t_mm} / {r_deg} | {views} | {medians['twinloop'][0]:.2f} / {medians['twinloop'][1]:.3f} "
              f"| {cells} | {ratio[0]:.2f} / {ratio[1]:.2f} |")
        if (pixel, t_mm, views) == (0.5, 0.5, 15):
            goal = ratio
    if goal is not None:
        verdict = "MET" if max(goal) <= 0.7 else "NOT MET"
        print(f"goal (median error <= 0.7x the best OpenCV method at 0.5 px, 0.5 mm / 0.05 deg, 15 views): "
              f"translation {goal[0]:.2f}, rotation {goal[1]:.2f} -> {verdict}")


def _leave_one_out(views, camera, solve) -> tuple[float, float, float]:
    """(translation mm, rotation deg) RMS of the left-out views' base_T_target, seconds per solve."""
    translation, rotation, seconds = [], [], []
    for i, view in enumerate(views):
        started = time.perf_counter()
        x, b, scale = solve([v for j, v in enumerate(views) if j != i])
        seconds.append(time.perf_counter() - started)
        seen = Detection(view.detection.ids, view.detection.object_points * scale, view.detection.image_points)
        t, r = se3.errors(view.base_T_gripper @ x @ solve_pnp(seen, camera), b)
        translation.append(t)
        rotation.append(r)
    return (float(np.sqrt(np.mean(np.square(translation))) * 1e3), math.degrees(np.sqrt(np.mean(np.square(rotation)))),
            float(np.median(seconds)))


def _ours(camera, correct_scale: bool = False):
    options = handeye.Options(max_translation_std_m=1.0, max_rotation_std_deg=90.0, correct_scale=correct_scale)

    def solve(views):
        result = handeye.calibrate("eye_in_hand", views, camera, options)
        # the left-out view's PnP with the target as the result sees it
        return (result.transform, result.target_transform,
                result.scale_check.scale if result.scale_check.applied else 1.0)
    return solve


def _opencv(camera, name):
    def solve(views):
        x, _ = handeye.opencv_estimates("eye_in_hand", views, camera)[name]
        # the target pose as OpenCV users get it: the mean over the views of robot . X . PnP
        return x, se3.mean([v.base_T_gripper @ x @ solve_pnp(v.detection, camera) for v in views]), 1.0
    return solve


def real() -> None:
    from twinloop_calibration.datasets import load_industrial_calibration
    if not REAL.is_file():
        raise SystemExit(f"the real data set is not at {REAL}")
    data = load_industrial_calibration(REAL)
    calibrated = calibrate_intrinsics([v.detection for v in data.views], (data.camera.width, data.camera.height))
    for label, camera in (("nominal intrinsics (fx 550)", data.camera),
                          (f"intrinsics from the same views (fx {calibrated.camera_matrix[0, 0]:.1f})", calibrated)):
        print(f"\nreal 10x10 set, 15 views, {label}: leave-one-out base->target consistency, RMS over the views")
        print("| method | translation mm | rotation deg | seconds per solve |")
        print("|---|---|---|---|")
        rows = {"twinloop": _leave_one_out(data.views, camera, _ours(camera)),
                "twinloop --correct-scale": _leave_one_out(data.views, camera, _ours(camera, True))}
        for name in OPENCV:
            rows[name] = _leave_one_out(data.views, camera, _opencv(camera, name))
        for name, (t, r, seconds) in rows.items():
            print(f"| {name} | {t:.2f} | {r:.3f} | {seconds:.3f} |")
        best_t = min(rows[n][0] for n in OPENCV)
        best_r = min(rows[n][1] for n in OPENCV)
        print(f"ours / best OpenCV: translation {rows['twinloop'][0] / best_t:.2f} (goal <= 1), "
              f"rotation {rows['twinloop'][1] / best_r:.2f} (goal <= 1.1)")
        check = handeye.calibrate("eye_in_hand", data.views, camera, handeye.Options(
            max_translation_std_m=1.0, max_rotation_std_deg=90.0)).scale_check
        print("scale check: " + check.describe(data.target.spacing_m))
    spec = TargetSpec("chessboard_24x17", "chessboard", 24, 17, 0.01)
    for label, distortion in (("no distortion", np.zeros(5)), ("plumb_bob distortion", np.array([0.1, -0.2, 0.001, 0.001, 0.05]))):
        camera = CameraModel(synthetic.DEFAULT_CAMERA.camera_matrix, distortion, 640, 480)
        views = synthetic.eye_in_hand(views=28, seed=3, camera=camera, target=spec, max_tilt_deg=30, max_roll_deg=30,
                                      distance_m=(0.35, 0.55)).views
        timings = {}
        for bootstrap in (0, 30):
            started = time.perf_counter()
            handeye.calibrate("eye_in_hand", views, camera, handeye.Options(bootstrap=bootstrap))
            timings[bootstrap] = time.perf_counter() - started
        started = time.perf_counter()
        handeye.opencv_estimates("eye_in_hand", views, camera)
        opencv_s = time.perf_counter() - started
        print(f"\n28 synthetic views of 24x17 corners ({label}): one calibration {timings[0]:.1f} s "
              f"(analytic covariance), {timings[30]:.1f} s with a 30-resample bootstrap (goal <= 10 s); "
              f"OpenCV's 7 methods with PnP of every view: {opencv_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
