"""A folder of images and a robot pose file: what most users have. Rendered chessboard views
with known truth, the real 10x10 set laid out as a folder, and bad pose files."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from twinloop_calibration import cli, handeye, se3, synthetic
from twinloop_calibration.datasets import DatasetError, load_camera_info_yaml, load_folder, load_industrial_calibration
from twinloop_calibration.targets import TargetSpec, load_targets
from twinloop_twin.workcell import default_config_dir

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data" / "handeye_ros_industrial_10x10"
needs_data = pytest.mark.skipif(not (DATA / "cal_data.yaml").is_file(), reason=f"real data set not at {DATA}")
README = ROOT / "src" / "twinloop_calibration" / "README.md"


def _render_chessboard_capture(folder: Path, spec: TargetSpec, *, views: int = 15, seed: int = 4):
    """Images of a printed chessboard seen by a wrist camera (homography of a drawn board,
    blur, sensor noise) and the robot's reported poses in mm (0.5 mm / 0.05 deg error);
    returns the synthetic set (truth)."""
    data = synthetic.eye_in_hand(views=views, seed=seed, target=spec, pixel_std=0.0, max_roll_deg=30)
    camera = data.camera
    per_metre = 8000.0
    side = spec.spacing_m
    origin = -2 * side  # the texture's top-left corner in the target frame, both axes
    texture = np.full((int(round((spec.rows + 4) * side * per_metre)), int(round((spec.cols + 4) * side * per_metre))),
                      235, np.uint8)
    cell = int(round(side * per_metre))
    for i in range(-1, spec.cols):
        for j in range(-1, spec.rows):
            if (i + j) % 2 == 0:
                u, v = int(round((i * side - origin) * per_metre)), int(round((j * side - origin) * per_metre))
                texture[v:v + cell, u:u + cell] = 20
    texture_to_target = np.array([[1 / per_metre, 0, origin], [0, 1 / per_metre, origin], [0, 0, 1.0]])
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True)
    lines = ["# image  x y z (mm)  qx qy qz qw: base_T_gripper reported by the controller"]
    for k, (view, truth) in enumerate(zip(data.views, data.base_T_gripper_true)):
        camera_T_target = se3.inv(data.x_true) @ se3.inv(truth) @ data.b_true
        homography = camera.camera_matrix @ camera_T_target[:3][:, [0, 1, 3]] @ texture_to_target
        image = cv2.warpPerspective(texture, homography, (camera.width, camera.height), flags=cv2.INTER_AREA,
                                    borderValue=128)
        image = np.clip(cv2.GaussianBlur(image, (3, 3), 0.7) + rng.normal(0, 2.0, image.shape), 0, 255)
        cv2.imwrite(str(folder / "images" / f"view_{k:02d}.png"), image.astype(np.uint8))
        xyz, quaternion = se3.to_xyz_quat(view.base_T_gripper)  # the reported (noisy) pose
        lines.append(f"view_{k:02d}.png " + " ".join(f"{v:.4f}" for v in xyz * 1e3) + " "
                     + " ".join(f"{v:.9f}" for v in quaternion))
    (folder / "poses.txt").write_text("\n".join(lines) + "\n")
    return data


def _reported_transform(stdout: str) -> np.ndarray:
    match = re.search(r"gripper_T_camera: xyz \[([^\]]+)\] m, quaternion xyzw \[([^\]]+)\]", stdout)
    assert match, stdout
    return se3.from_xyz_quat([float(v) for v in match.group(1).split(",")],
                             [float(v) for v in match.group(2).split(",")])


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})


def test_readme_folder_command_calibrates_a_rendered_chessboard(tmp_path):
    """The README's `twinloop calibrate --images ...` line, as written, in a folder holding
    `my_capture/` (rendered chessboard images, poses in mm): intrinsics calibrated from the
    views, the result within 3 sigma of the truth, no scale alarm."""
    (command,) = re.findall(r"^(twinloop calibrate --images .*?)\s+#", README.read_text(), re.M)
    targets, _ = load_targets(default_config_dir() / "calibration_targets.yaml")
    spec = targets[re.search(r"--target (\S+)", command).group(1)]
    assert spec.kind == "chessboard"
    data = _render_chessboard_capture(tmp_path / "my_capture", spec)
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "intrinsics calibrated from the same views" in done.stderr
    error_t, error_r = se3.errors(_reported_transform(done.stdout), data.x_true)
    print(f"rendered chessboard, 15 views: {error_t * 1e3:.2f} mm, {math.degrees(error_r):.3f} deg from the truth")
    sigma = re.search(r"1-sigma: ([0-9.]+) mm, ([0-9.]+) deg", done.stdout)
    sigma_t, sigma_r = float(sigma.group(1)) * 1e-3, math.radians(float(sigma.group(2)))
    print(f"  reported 1-sigma {sigma_t * 1e3:.2f} mm, {math.degrees(sigma_r):.3f} deg")
    # 0.5 mm / 0.05 deg robot pose error on 15 views, intrinsics from the same views: within
    # 3 sigma of the reported uncertainty, and a few millimetres in all.
    assert error_t < 3 * sigma_t and error_r < 3 * sigma_r
    assert error_t < 5e-3 and math.degrees(error_r) < 0.6
    assert "consistent with the target description" in done.stdout and "WARNING" not in done.stdout


@needs_data
def test_the_real_set_as_a_folder_gives_the_data_set_loader_views(tmp_path):
    """The 10x10 set laid out as a folder (poses as x y z quaternion in m, and as 4x4 in mm;
    intrinsics as a camera_info YAML): the same views and the same calibration."""
    dataset = load_industrial_calibration(DATA / "cal_data.yaml")
    shutil.copytree(DATA / "images", tmp_path / "images")
    entries = yaml.safe_load((DATA / "cal_data.yaml").read_text())["data"]
    quaternion_lines, matrix_lines = [], []
    for entry in entries:
        pose = yaml.safe_load((DATA / entry["pose"]).read_text())
        name = Path(entry["image"]).name
        quaternion_lines.append(f"{name} " + " ".join(repr(pose[k]) for k in ("x", "y", "z", "qx", "qy", "qz", "qw")))
        matrix = se3.from_xyz_quat([pose["x"], pose["y"], pose["z"]], [pose["qx"], pose["qy"], pose["qz"], pose["qw"]])
        matrix[:3, 3] *= 1e3
        matrix_lines.append(f"{name}, " + ", ".join(repr(float(v)) for v in matrix.ravel()))
    (tmp_path / "poses.txt").write_text("\n".join(quaternion_lines) + "\n")
    (tmp_path / "poses_4x4_mm.txt").write_text("# 4x4 row by row, mm\n" + "\n".join(matrix_lines) + "\n")
    (tmp_path / "camera.yaml").write_text(yaml.safe_dump({
        "image_width": 640, "image_height": 480, "camera_name": "kinect_rgb",
        "camera_matrix": {"rows": 3, "cols": 3, "data": [550.0, 0, 320.0, 0, 550.0, 240.0, 0, 0, 1]},
        "distortion_model": "plumb_bob", "distortion_coefficients": {"rows": 1, "cols": 5, "data": [0.0] * 5}}))
    targets, _ = load_targets(default_config_dir() / "calibration_targets.yaml")
    camera = load_camera_info_yaml(tmp_path / "camera.yaml")
    by_quaternion = load_folder(tmp_path / "images", tmp_path / "poses.txt", targets["ros_industrial_10x10"],
                                camera=camera)
    by_matrix = load_folder(tmp_path / "images", tmp_path / "poses_4x4_mm.txt", targets["ros_industrial_10x10"],
                            camera=camera, pose_units="mm")
    reference = {Path(v.label).name: v for v in dataset.views}
    for folder_set in (by_quaternion, by_matrix):
        assert len(folder_set.views) == 15 and folder_set.not_found == []
        for view in folder_set.views:
            assert np.abs(view.base_T_gripper - reference[view.label].base_T_gripper).max() < 1e-9
            assert np.array_equal(view.detection.image_points, reference[view.label].detection.image_points)
    np.testing.assert_allclose(camera.camera_matrix, dataset.camera.camera_matrix)
    done = _run(f"twinloop calibrate --images {tmp_path / 'images'} --poses {tmp_path / 'poses_4x4_mm.txt'} "
                f"--pose-units mm --target ros_industrial_10x10 --intrinsics {tmp_path / 'camera.yaml'} "
                f"--bootstrap 0 --correct-scale --max-translation-std-m 0.02 --max-rotation-std-deg 3 "
                f"--output {tmp_path / 'kinect.yaml'}", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    api = handeye.calibrate("eye_in_hand", dataset.views, dataset.camera,
                            handeye.Options(correct_scale=True, max_translation_std_m=0.02, max_rotation_std_deg=3.0))
    error_t, error_r = se3.errors(_reported_transform(done.stdout), api.transform)
    assert error_t < 1e-5 and error_r < 1e-4  # the report rounds to 5 decimals
    written = yaml.safe_load((tmp_path / "kinect.yaml").read_text())
    assert written["source"]["mode"] == "images" and written["source"]["pose_units"] == "mm"
    assert written["target_scale"]["anomalous"] is True  # the grid measures 24.8 mm, not 25.4 (see the scale test)


@pytest.mark.parametrize("content, says", [
    ("a.png 1 2 3\n", "expected '<image file>' and 7 finite numbers"),
    ("a.png 0 0 0 0 0 0 2\n", "unit quaternion"),
    ("a.png " + " ".join(["1"] * 16) + "\n", "not a rigid transform"),
    ("a.png 0 0 0 0 0 0 1\na.png 0 0 0 0 0 0 1\n", "more than one pose"),
    ("a.png 0 0 nan 0 0 0 1\n", "7 finite numbers"),
    ("a.png x 0 0 0 0 0 1\n", "expected '<image file>'"),
    ("# nothing\n", "no poses"),
    ("missing.png 0 0 0 0 0 0 1\n", "cannot read image"),
])
def test_a_bad_pose_file_is_one_clear_line_and_exit_2(tmp_path, capsys, content, says):
    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), np.full((48, 64), 128, np.uint8))
    (tmp_path / "poses.txt").write_text(content)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = cli.main(["--images", str(tmp_path / "images"), "--poses", str(tmp_path / "poses.txt"),
                     "--target", "chessboard_9x6", "--output", str(tmp_path / "out.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("twinloop calibrate: error: ") and says in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_images_without_poses_and_bad_intrinsics_are_refused(tmp_path, capsys):
    assert cli.main(["--images", str(tmp_path)]) == 2
    assert "--images needs --poses" in capsys.readouterr().err
    (tmp_path / "camera.yaml").write_text("image_width: 640\nimage_height: 480\ncamera_matrix: {data: [1, 2]}\n")
    with pytest.raises(DatasetError, match="camera_matrix.data"):
        load_camera_info_yaml(tmp_path / "camera.yaml")
