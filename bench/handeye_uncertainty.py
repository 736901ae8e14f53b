"""Does a calibration's reported uncertainty match the scatter of its views?

For each data set, one calibration as a user runs it (defaults, plus the options named) and
its reported 1-sigma (sqrt of the covariance's trace, translation and rotation), side by side
in one run with
- the bootstrap of the whole calibration: the views resampled with replacement and every
  resample calibrated again from scratch (noise model, candidate choice, scale check);
- the jackknife of the whole calibration: each view left out in turn (the leave-one-out
  scatter), (n - 1) / n * sum of squared deviations;
- the calibration's own bootstrap (the estimate's problem solved on resamples, its noise
  model held; what `--bootstrap` prints);
and, on synthetic sets, the error against the known truth. Prints the ratios reported /
bootstrap and reported / jackknife (goal: within 1.5x).

  python bench/handeye_uncertainty.py                 # the real 10x10 set (3 ways) and 3 synthetic sets, ~10 min
  python bench/handeye_uncertainty.py --resamples 15  # quicker, noisier
"""
from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from twinloop_calibration import handeye, se3, synthetic
from twinloop_calibration.datasets import load_industrial_calibration
from twinloop_calibration.degeneracy import CalibrationError
from twinloop_calibration.intrinsics import calibrate_intrinsics

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "handeye_ros_industrial_10x10" / "cal_data.yaml"
# The real set is uncertain to centimetres: open the limits so that every resample gives a result.
LOOSE = {"max_translation_std_m": 1.0, "max_rotation_std_deg": 90.0}


def _std(covariance: np.ndarray) -> tuple[float, float]:
    return math.sqrt(np.trace(covariance[:3, :3])), math.sqrt(np.trace(covariance[3:6, 3:6]))


def measure(name: str, views, camera, options: handeye.Options, resamples: int, truth=None) -> None:
    started = time.perf_counter()
    result = handeye.calibrate("eye_in_hand", views, camera, replace(options, bootstrap=40))
    wall = time.perf_counter() - started
    quiet = replace(options, bootstrap=0)
    rng = np.random.default_rng(0)
    boot, methods = [], Counter()
    for _ in range(resamples):
        pick = rng.integers(0, len(views), len(views))
        try:
            again = handeye.calibrate("eye_in_hand", [views[i] for i in pick], camera, quiet)
        except CalibrationError:
            methods["refused"] += 1
            continue
        boot.append(se3.difference(again.transform, result.transform))
        methods[again.method] += 1
    jack = []
    for i in range(len(views)):
        try:
            again = handeye.calibrate("eye_in_hand", [v for k, v in enumerate(views) if k != i], camera, quiet)
        except CalibrationError:
            continue
        jack.append(se3.difference(again.transform, result.transform))
    jack = np.array(jack)
    centred = jack - jack.mean(axis=0)
    reported, bootstrap = _std(result.covariance), _std(np.cov(np.array(boot).T))
    jackknife = _std((len(jack) - 1) / len(jack) * centred.T @ centred)
    own = result.bootstrap_ratio
    print(f"{name}: {result.method} ({result.extra['covariance_model']}), {wall:.1f} s")
    print(f"  reported {reported[0] * 1e3:.2f} mm / {math.degrees(reported[1]):.3f} deg; whole-calibration bootstrap "
          f"({len(boot)} of {resamples}) {bootstrap[0] * 1e3:.2f} / {math.degrees(bootstrap[1]):.3f}; jackknife "
          f"({len(jack)}) {jackknife[0] * 1e3:.2f} / {math.degrees(jackknife[1]):.3f}")
    print(f"  reported / bootstrap {reported[0] / bootstrap[0]:.2f} / {reported[1] / bootstrap[1]:.2f}; reported / "
          f"jackknife {reported[0] / jackknife[0]:.2f} / {reported[1] / jackknife[1]:.2f}; own bootstrap "
          f"{own[0]:.2f} / {own[1]:.2f}; resamples chose {dict(methods)}")
    if truth is not None:
        d = se3.difference(result.transform, truth)
        print(f"  error {np.linalg.norm(d[:3]) * 1e3:.2f} mm / {math.degrees(np.linalg.norm(d[3:])):.3f} deg, "
              f"Mahalanobis^2 {d @ np.linalg.solve(result.covariance, d):.1f} (6 dof)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resamples", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if REAL.is_file():
        data = load_industrial_calibration(REAL)
        from_views = calibrate_intrinsics([v.detection for v in data.views], (data.camera.width, data.camera.height))
        measure("10x10, nominal intrinsics", data.views, data.camera, handeye.Options(**LOOSE), args.resamples)
        measure("10x10, nominal intrinsics, --correct-scale", data.views, data.camera,
                handeye.Options(correct_scale=True, **LOOSE), args.resamples)
        measure("10x10, intrinsics from the views, --correct-scale", data.views, from_views,
                handeye.Options(correct_scale=True, **LOOSE), args.resamples)
    else:
        print(f"real set not at {REAL}: skipped")
    for seed in range(args.seeds):
        data = synthetic.eye_in_hand(views=15, seed=seed)
        measure(f"synthetic seed {seed} (15 views, 0.5 px, 0.5 mm / 0.05 deg)", data.views, data.camera,
                handeye.Options(), args.resamples, truth=data.x_true)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
