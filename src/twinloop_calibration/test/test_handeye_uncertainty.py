"""The reported uncertainty against the scatter of the views: the covariance a calibration
reports (analytic where the noise model holds, the jackknife over the views where it does
not, the jackknife of OpenCV's method where the result is OpenCV's) against a bootstrap over
the views, on the real 10x10 set and on synthetic views with known truth (whose coverage
test_handeye_synthetic.py checks).

Tolerance: the reported std within 1.5x of the bootstrap's. A 40-resample bootstrap's std is
itself uncertain by about +-11 % (sqrt(1 / 78)), so single synthetic seeds are held to
0.6-1.7x and their median to 0.8-1.25x."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from twinloop_calibration import handeye, synthetic
from twinloop_calibration.datasets import load_industrial_calibration
from twinloop_calibration.intrinsics import calibrate_intrinsics

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "handeye_ros_industrial_10x10"
needs_data = pytest.mark.skipif(not (DATA / "cal_data.yaml").is_file(), reason=f"real data set not at {DATA}")
RATIO = 1.5
# The real set is uncertain to centimetres (its leave-one-out consistency is 8-20 mm): the
# limits are opened so that the covariance, not the refusal, is under test.
LOOSE = {"max_translation_std_m": 1.0, "max_rotation_std_deg": 90.0}


@pytest.fixture(scope="module")
def dataset():
    return load_industrial_calibration(DATA / "cal_data.yaml")


@needs_data
@pytest.mark.parametrize("intrinsics, correct_scale, model", [
    ("nominal", False, "opencv_jackknife"),  # the grid's scale is off: the result is OpenCV's estimate
    ("nominal", True, "per_view_jackknife_scale_free"),
    ("from the views", True, "per_view_jackknife_scale_free+intrinsics"),
])
def test_real_set_covariance_within_1_5x_of_the_bootstrap(dataset, intrinsics, correct_scale, model):
    camera = dataset.camera if intrinsics == "nominal" else calibrate_intrinsics(
        [v.detection for v in dataset.views], (dataset.camera.width, dataset.camera.height))
    result = handeye.calibrate("eye_in_hand", dataset.views, camera,
                               handeye.Options(bootstrap=40, correct_scale=correct_scale, **LOOSE))
    std_t, std_r = result.std
    ratio_t, ratio_r = result.bootstrap_ratio
    print(f"{intrinsics} intrinsics, correct_scale={correct_scale}: {result.method}, 1-sigma {std_t * 1e3:.1f} mm / "
          f"{np.degrees(std_r):.3f} deg ({result.extra['covariance_model']}); reported / bootstrap std "
          f"{ratio_t:.2f} / {ratio_r:.2f}")
    assert result.extra["covariance_model"] == model
    assert 1 / RATIO < ratio_t < RATIO and 1 / RATIO < ratio_r < RATIO


def test_synthetic_covariance_within_1_5x_of_the_bootstrap():
    ratios = []
    for seed in range(6):
        data = synthetic.eye_in_hand(views=15, seed=seed)
        result = handeye.calibrate("eye_in_hand", data.views, data.camera, handeye.Options(bootstrap=40))
        ratios.append(result.bootstrap_ratio)
        print(f"seed {seed}: {result.method}, reported / bootstrap std {ratios[-1][0]:.2f} / {ratios[-1][1]:.2f}")
    ratios = np.array(ratios)
    median = np.median(ratios, axis=0)
    print(f"median {median[0]:.2f} / {median[1]:.2f}")
    assert np.all((0.8 < median) & (median < 1.25))
    assert np.all((0.6 < ratios) & (ratios < 1.7))
