"""Hand-eye accuracy: twinloop_calibration vs OpenCV's methods on the same synthetic views.

Sweeps pixel noise and robot pose noise over seeds and view counts; for each setting
prints the median translation and rotation error of our result (as shipped: refinement,
noise model, k-fold choice) and of every OpenCV method computed from the same data in the
same run, and the ratio of ours to the best OpenCV method. Goal: ratio <= 0.7 at realistic
noise (0.5 px, 0.5 mm / 0.05 deg).

  python bench/handeye_accuracy.py            # full sweep, ~10 min on 2 cores
  python bench/handeye_accuracy.py --quick    # realistic noise only
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import time

import numpy as np

from twinloop_calibration import handeye, se3, synthetic
from twinloop_calibration.degeneracy import CalibrationError

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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
