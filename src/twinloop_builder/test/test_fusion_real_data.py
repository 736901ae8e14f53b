"""TSDF fusion on five real PrimeSense frames (../shared/data/rgbd_primesense_5frames/).

The data set's poses make the frames agree to a median of about 8 mm (its README); fused,
every frame's points should lie about that close to the one surface, or closer (the
surface averages them).
"""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from twinloop_builder.geometry.fusion import FusionSettings, PosedFrame, frame_points, fuse, point_to_mesh_distance_m

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data" / "rgbd_primesense_5frames"


def load_frames() -> list[PosedFrame]:
    """Open3D's test-data layout: rgbd.match pairs, camera-to-world poses in trajectory.log
    (a header line, then four matrix rows, per frame), the intrinsic matrix column-major."""
    intrinsics = json.loads((DATA / "camera_primesense.json").read_text())
    camera_matrix = np.array(intrinsics["intrinsic_matrix"], float).reshape(3, 3).T
    rows = [line.split() for line in (DATA / "trajectory.log").read_text().splitlines() if line.strip()]
    poses = [np.array(rows[i + 1:i + 5], float) for i in range(0, len(rows), 5)]
    pairs = [line.split() for line in (DATA / "rgbd.match").read_text().splitlines() if line.strip()]
    assert len(pairs) == len(poses) == 5
    return [PosedFrame(cv2.imread(str(DATA / color))[:, :, ::-1], cv2.imread(str(DATA / depth), cv2.IMREAD_UNCHANGED),
                       camera_matrix, pose, name=color) for (depth, color), pose in zip(pairs, poses)]


@pytest.mark.skipif(not DATA.is_dir(), reason=f"{DATA} is not here")
def test_five_real_frames_fuse_into_a_surface_they_agree_with():
    frames = load_frames()
    surface = fuse(frames, FusionSettings(voxel_size_m=0.01, depth_max_m=3.0))
    distances = np.concatenate([point_to_mesh_distance_m(frame_points(f, stride=4, depth_max_m=3.0), surface)
                                for f in frames])
    median_mm, p90_mm = np.median(distances) * 1e3, np.percentile(distances, 90) * 1e3
    print(f"{len(surface.vertices)} vertices, {len(surface.triangles)} triangles; frame points to the surface: "
          f"median {median_mm:.2f} mm, p90 {p90_mm:.2f} mm")
    assert len(surface.triangles) > 50_000
    assert median_mm <= 8.0 and p90_mm <= 20.0
    # colors come through (the scene is not grey)
    assert surface.colors.shape == surface.vertices.shape and surface.colors.std() > 0.05
    assert 0.0 <= surface.colors.min() and surface.colors.max() <= 1.0
