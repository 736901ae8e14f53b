"""Geometry from a wrist-camera scan of the emulated cell, against its true geometry.

The ten wrist-camera views of `twinloop build excite --kind scan` (home and joint-space
variations of it: the arm swung left and right, the hand higher and lower) are rendered with the truth's depth noise; each view's
camera pose is forward kinematics of the joint positions with the URDF's camera mount, as
a scan reads them from joint states and the hand-eye calibration. The frames are fused
(TSDF, Open3D VoxelBlockGrid) and segmented (table plane, objects on it). Ground truth
(the table's height, the box's pose and size) scores the result only.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede `import mujoco`

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
import open3d as o3d  # noqa: E402
from scipy.spatial import Delaunay  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

from twinloop_builder.geometry.fusion import FusionError, FusionSettings, PosedFrame, fuse  # noqa: E402
from twinloop_builder.geometry.assembly import GeometryBuildError, build_geometry_twin  # noqa: E402
from twinloop_builder.geometry.objects import SegmentationSettings, TableObject, segment_table  # noqa: E402
from twinloop_perception.box_tracking import symmetric_rotation_error_rad  # noqa: E402
from twinloop_builder.synthetic import BRACKET_ARMS, BRACKET_HEIGHT_M, BRACKET_NOTCH, bracket_cell, render_scan  # noqa: E402,E501
from twinloop_twin.bundle import load_twin_version  # noqa: E402
from twinloop_twin.nominal import build_nominal_twin, load_scene, load_twin_workcell, scene_files, twin_geometry  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.usd_export import export_twin_usd  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

TABLE_REGION = ((0.1, 1.0), (-0.6, 0.6))  # m, world xy: the table in front of the robot


@pytest.fixture(scope="module")
def scan():
    workcell = load_workcell()
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    frames, box_truth = render_scan(workcell, truth, seed=4)
    surface = fuse(frames, FusionSettings(depth_max_m=1.5))
    segmentation = segment_table(surface.vertices, SegmentationSettings(region_xy_m=TABLE_REGION))
    return workcell, box_truth, frames, surface, segmentation


def test_the_box_is_found_within_5_mm_and_3_deg_with_its_size_within_5_mm(scan):
    workcell, box_truth, _, _, segmentation = scan
    box = min(segmentation.objects, key=lambda o: np.linalg.norm(o.world_T_object[:3, 3] - box_truth[:3]))
    rotation = Rotation.from_quat([box_truth[4], box_truth[5], box_truth[6], box_truth[3]]).as_matrix()
    error_mm = np.linalg.norm(box.world_T_object[:3, 3] - box_truth[:3]) * 1e3
    angle_deg = np.degrees(symmetric_rotation_error_rad(box.world_T_object[:3, :3], rotation, workcell.box.size_m))
    size_error_mm = np.abs(np.sort(box.size_m) - np.sort(workcell.box.size_m)) * 1e3
    print(f"{len(segmentation.objects)} objects; box {error_mm:.2f} mm / {angle_deg:.2f} deg from the truth, "
          f"size {np.round(box.size_m * 1e3, 1).tolist()} mm (errors {np.round(size_error_mm, 1).tolist()})")
    assert error_mm <= 5.0 and angle_deg <= 3.0
    assert np.all(size_error_mm <= 5.0)


def test_the_table_plane_is_the_true_table_top(scan):
    workcell, *_, segmentation = scan
    normal, offset = segmentation.plane[:3], segmentation.plane[3]
    tilt_deg = np.degrees(np.arccos(normal[2]))
    print(f"table plane: height {-offset * 1e3:.2f} mm (truth {workcell.table_top_height_m * 1e3:.0f}), "
          f"tilt {tilt_deg:.3f} deg")
    assert abs(-offset - workcell.table_top_height_m) <= 0.002 and tilt_deg <= 0.5


def test_fused_surface_lies_on_the_true_table_and_box(scan):
    """Accuracy: fused vertices over the table (away from the board's 3 mm and the box) are on
    the true table plane; those of the box on its true faces. Completeness: the box's true
    top face is covered."""
    workcell, box_truth, _, surface, segmentation = scan
    (x0, x1), (y0, y1) = TABLE_REGION
    vertices = surface.vertices
    in_region = (vertices[:, 0] > x0) & (vertices[:, 0] < x1) & (vertices[:, 1] > y0) & (vertices[:, 1] < y1)
    rotation = Rotation.from_quat([box_truth[4], box_truth[5], box_truth[6], box_truth[3]]).as_matrix()
    local = (vertices - box_truth[:3]) @ rotation
    half = np.asarray(workcell.box.size_m) / 2
    outside = np.maximum(np.abs(local) - half, 0.0)
    inside = np.minimum(np.max(np.abs(local) - half, axis=1), 0.0)
    box_distance = np.linalg.norm(outside, axis=1) + np.abs(inside)
    table_distance = np.abs(vertices[:, 2] - workcell.table_top_height_m)
    near_box = box_distance < 0.03
    table = in_region & ~near_box & (vertices[:, 2] < workcell.table_top_height_m + 0.02)
    on_box = in_region & near_box & (vertices[:, 2] > workcell.table_top_height_m + 0.01)
    distance = np.minimum(table_distance, box_distance)
    print(f"table: {table.sum()} vertices, median {np.median(distance[table]) * 1e3:.2f} mm "
          f"(the board stands 3 mm proud), p90 {np.percentile(distance[table], 90) * 1e3:.2f}; box: {on_box.sum()} "
          f"vertices, median {np.median(box_distance[on_box]) * 1e3:.2f} mm, p90 "
          f"{np.percentile(box_distance[on_box], 90) * 1e3:.2f}")
    assert np.median(distance[table]) <= 2.0 and np.percentile(distance[table], 90) <= 4.0
    assert np.median(box_distance[on_box]) <= 2.0 and np.percentile(box_distance[on_box], 90) <= 5.0
    u, v = np.meshgrid(np.linspace(-0.8, 0.8, 9) * half[0], np.linspace(-0.8, 0.8, 9) * half[1])
    top = np.column_stack([u.ravel(), v.ravel(), np.full(u.size, half[2])]) @ rotation.T + box_truth[:3]
    gaps = np.array([np.min(np.linalg.norm(vertices[on_box] - p, axis=1)) for p in top])
    print(f"box top face covered: farthest of 81 samples from a vertex {gaps.max() * 1e3:.2f} mm")
    assert gaps.max() <= 6.0e-3


def test_chamfer_distance_of_the_table_and_box_to_their_true_surfaces(scan):
    """Both ways, near the box: true surface samples (the box's faces, the table within 8 cm
    of its footprint) that some view saw (in its image, facing it, not hidden behind the
    box) to the fused surface (completeness), and fused vertices there to the true
    surface (accuracy); the Chamfer distance is their mean."""
    workcell, box_truth, frames, surface, _ = scan
    rotation = Rotation.from_quat([box_truth[4], box_truth[5], box_truth[6], box_truth[3]]).as_matrix()
    half = np.asarray(workcell.box.size_m) / 2
    step = 0.002
    samples, normals = [], []
    for axis in range(3):
        for sign in (-1.0, 1.0):
            u, v = [np.arange(-half[k], half[k] + 1e-9, step) for k in range(3) if k != axis]
            uu, vv = np.meshgrid(u, v)
            face = np.zeros((uu.size, 3))
            face[:, [k for k in range(3) if k != axis]] = np.column_stack([uu.ravel(), vv.ravel()])
            face[:, axis] = sign * half[axis]
            samples.append(face @ rotation.T + box_truth[:3])
            normals.append(np.tile(rotation[:, axis] * sign, (len(face), 1)))
    gx, gy = np.meshgrid(np.arange(-0.08 - half[0], 0.08 + half[0], step), np.arange(-0.08 - half[1], 0.08 + half[1], step))
    table = np.column_stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)])
    table = table[np.max(np.abs(table[:, :2] @ rotation[:2, :2]), axis=1) > half[0] + 0.002]  # not under the box
    samples.append(table + [box_truth[0], box_truth[1], workcell.table_top_height_m])
    normals.append(np.tile([0.0, 0.0, 1.0], (len(table), 1)))
    truth, normal = np.vstack(samples), np.vstack(normals)
    seen = np.zeros(len(truth), bool)
    for frame in frames:
        centre = frame.world_T_camera[:3, 3]
        camera = (truth - centre) @ frame.world_T_camera[:3, :3]
        pixel = camera @ np.asarray(frame.camera_matrix).T
        with np.errstate(divide="ignore", invalid="ignore"):
            u, v = pixel[:, 0] / pixel[:, 2], pixel[:, 1] / pixel[:, 2]
        in_image = (camera[:, 2] > 0) & (u >= 0) & (u < frame.color.shape[1]) & (v >= 0) & (v < frame.color.shape[0])
        facing = np.einsum("ij,ij->i", normal, centre - truth) > 0
        seen |= in_image & facing & ~_hidden_by_box(truth + 1e-3 * normal, centre, box_truth[:3], rotation, half)
    truth = truth[seen]
    near = surface.vertices[np.all(np.abs(surface.vertices[:, :2] - box_truth[:2]) < 0.08 + half[0], axis=1)
                            & (surface.vertices[:, 2] > workcell.table_top_height_m - 0.02)]
    local = (near - box_truth[:3]) @ rotation
    box_distance = np.linalg.norm(np.maximum(np.abs(local) - half, 0.0), axis=1) + \
        np.abs(np.minimum(np.max(np.abs(local) - half, axis=1), 0.0))
    accuracy = np.minimum(box_distance, np.abs(near[:, 2] - workcell.table_top_height_m))
    fused = o3d.t.geometry.RaycastingScene()
    fused.add_triangles(o3d.t.geometry.TriangleMesh.from_legacy(surface.to_open3d()))
    completeness = fused.compute_distance(o3d.core.Tensor(truth.astype(np.float32))).numpy()  # to the fused surface
    chamfer_mm = (accuracy.mean() + completeness.mean()) / 2 * 1e3
    print(f"Chamfer near the box: {chamfer_mm:.2f} mm (accuracy: {len(near)} vertices, mean "
          f"{accuracy.mean() * 1e3:.2f} mm; completeness: {len(truth)} true samples seen of {len(seen)}, mean "
          f"{completeness.mean() * 1e3:.2f} mm, median {np.median(completeness) * 1e3:.2f} mm, p95 "
          f"{np.percentile(completeness, 95) * 1e3:.2f} mm)")
    # the tail is the box's side walls seen at grazing angles and the table along its foot,
    # which the TSDF rounds (truncation 3 voxels)
    assert chamfer_mm <= 2.5 and np.median(completeness) <= 2.0e-3


def _hidden_by_box(points, centre, box_centre, rotation, half) -> np.ndarray:
    """Whether the segment from each point to the camera centre passes through the box
    (slab test in the box's frame)."""
    start = (points - box_centre) @ rotation
    direction = (centre - box_centre) @ rotation - start
    with np.errstate(divide="ignore", invalid="ignore"):
        t0, t1 = (-half - start) / direction, (half - start) / direction
    enter = np.nanmax(np.minimum(t0, t1), axis=1)
    leave = np.nanmin(np.maximum(t0, t1), axis=1)
    return (enter < leave) & (leave > 0) & (enter < 1)


def test_bad_frames_are_refused_with_the_reason(scan):
    _, _, frames, _, _ = scan
    good = frames[0]
    with pytest.raises(FusionError, match="principal point"):
        fuse([PosedFrame(good.color, good.depth_mm, good.camera_matrix * [[1, 1, 10], [1, 1, 10], [1, 1, 1]],
                         good.world_T_camera, "wrong intrinsics")])
    with pytest.raises(FusionError, match="no depth"):
        fuse([PosedFrame(good.color, np.zeros_like(good.depth_mm), good.camera_matrix, good.world_T_camera, "empty")])
    with pytest.raises(FusionError, match="not one aligned pair"):
        fuse([PosedFrame(good.color[:240], good.depth_mm, good.camera_matrix, good.world_T_camera, "half")])
    with pytest.raises(FusionError, match="not a rigid"):
        fuse([PosedFrame(good.color, good.depth_mm, good.camera_matrix, good.world_T_camera * 2.0, "scaled")])
    with pytest.raises(FusionError, match="no frames"):
        fuse([])


def test_the_scan_becomes_the_next_twin_version_whose_scene_steps_cleanly(scan, tmp_path):
    workcell, box_truth, frames, surface, segmentation = scan
    build_nominal_twin(tmp_path, "emulated")
    # an object the description lacks, beside what the scan found: a 10 cm block on the table
    block = TableObject(np.eye(4), np.array([0.10, 0.08, 0.10]), np.zeros((200, 3)))
    block.world_T_object[:3, 3] = [0.62, 0.22, workcell.table_top_height_m + 0.05]
    extended = dataclasses.replace(segmentation, objects=[*segmentation.objects, block])
    twin, report = build_geometry_twin(tmp_path, "emulated", surface, extended, source={"frames": len(frames)})
    print(yaml.safe_dump(report, sort_keys=False))
    assert twin.version == 1 and twin.manifest.provenance.created_by == "geometry"
    assert twin.manifest.provenance.parent_version == 0
    assert twin.parameters.means() == load_twin_version(tmp_path, "emulated", 0).parameters.means()  # physics inherited
    layer = twin_geometry(twin)
    assert abs(layer.table_top_height_m - workcell.table_top_height_m) <= 0.002
    assert np.linalg.norm(np.array(layer.box_position_m) - box_truth[:3]) <= 0.005
    # the board and the static camera's stand are described already; only the block is new
    taken = [o["taken_for"] for o in report["objects"]]
    assert "new static object object_0" in taken and sum("new static" in t for t in taken) == 1, taken
    assert 0.97 <= report["box"]["size_ratio_to_description"] <= 1.01
    model = load_scene(twin)
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    box_qpos = slice(*[model.jnt_qposadr[model.body("box").jntadr[0]] + i for i in (0, 7)])
    np.testing.assert_allclose(data.qpos[box_qpos][:3], layer.box_position_m, atol=1e-9)
    mujoco.mj_step(model, data, nstep=1000)
    assert all(w.number == 0 for w in data.warning), [(i, w.number) for i, w in enumerate(data.warning) if w.number]
    assert np.linalg.norm(data.qpos[box_qpos][:3] - np.array(layer.box_position_m)) < 0.002  # it rests where scanned
    block_geom = model.geom("scanned_object_0_collision")
    assert model.geom_contype[block_geom.id] and block_geom.size[0] == pytest.approx(0.05)
    # the USD export for Isaac Sim carries the scanned object as a static collider
    from pxr import Usd, UsdPhysics
    stage = Usd.Stage.Open(str(export_twin_usd(twin, tmp_path / "twin.usda")))
    scanned = [p for p in stage.Traverse() if "scanned_object_0" in str(p.GetPath())]
    assert scanned and any(p.HasAPI(UsdPhysics.CollisionAPI) for p in scanned), [str(p.GetPath()) for p in scanned]
    # a later identification's scene keeps the geometry: the layer travels as an input
    files = scene_files(load_twin_workcell(twin), load_physics(twin.file_path("inputs/physics.yaml")), layer)
    assert b"scanned_object_0" in files["scene.xml"] and "inputs/geometry.yaml" in files


def test_a_scan_without_the_box_or_with_the_table_off_is_refused(scan, tmp_path):
    workcell, _, _, surface, segmentation = scan
    build_nominal_twin(tmp_path, "emulated")
    no_box = dataclasses.replace(segmentation, objects=[o for o in segmentation.objects if o.height_m > 0.1])
    with pytest.raises(GeometryBuildError, match="no scanned object has the box's size"):
        build_geometry_twin(tmp_path, "emulated", surface, no_box)
    lowered = dataclasses.replace(segmentation, plane=segmentation.plane + np.array([0, 0, 0, 0.05]))
    with pytest.raises(GeometryBuildError, match="check the camera poses"):
        build_geometry_twin(tmp_path, "emulated", surface, lowered)
    assert [p.name for p in (tmp_path / "emulated").iterdir() if not p.name.startswith(".")] == ["v0"]


@pytest.mark.parametrize("scan, expected", [
    ("missing_bag", "no bag at"),
    (str(Path(__file__).resolve().parents[2] / "shared" / "data" / "husky_imu_odom_gps" / "husky_test1_first60s_rosbag2_sqlite3"),
     "has no /wrist_camera/color/image_raw messages"),
])
def test_geometry_command_refuses_a_bag_that_is_not_a_scan(tmp_path, scan, expected):
    if "husky" in scan and not Path(scan).exists():
        pytest.skip(f"{scan} is not here")
    done = subprocess.run([sys.executable, "-m", "twinloop_builder.cli", "geometry", "--scan", scan,
                           "--root", str(tmp_path / "twins")], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("[")]
    assert done.returncode == 2 and len(lines) == 1 and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_an_undescribed_l_bracket_becomes_convex_collision_parts_that_leave_its_notch_free(tmp_path):
    workcell = load_workcell()
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    table = workcell.table_top_height_m
    frames, _ = render_scan(workcell, truth, seed=5, extra=bracket_cell(workcell))
    surface = fuse(frames, FusionSettings(depth_max_m=1.5))
    segmentation = segment_table(surface.vertices, SegmentationSettings(region_xy_m=TABLE_REGION))
    build_nominal_twin(tmp_path, "emulated")
    twin, report = build_geometry_twin(tmp_path, "emulated", surface, segmentation)
    new = [o for o in report["objects"] if "new static" in o["taken_for"]]
    print(yaml.safe_dump(new, sort_keys=False))
    assert len(new) == 1, report["objects"]
    bracket = twin_geometry(twin).objects[0]
    parts = [Delaunay(np.array(part)) for part in bracket.collision_parts]
    assert len(parts) >= 2, "a convex hull of an L fills its notch"
    world_T_object = np.eye(4)
    world_T_object[:3, :3] = Rotation.from_quat([*bracket.quat_wxyz[1:], bracket.quat_wxyz[0]]).as_matrix()
    world_T_object[:3, 3] = bracket.position_m
    # a 2 mm grid over the bracket's surroundings, from 5 mm above the table to 5 mm under its top
    (x0, x1), (y0, y1) = [(min(a[k][0] for a in BRACKET_ARMS) - 0.04, max(a[k][1] for a in BRACKET_ARMS) + 0.04)
                          for k in range(2)]
    gx, gy, gz = np.meshgrid(np.arange(x0, x1, 0.002), np.arange(y0, y1, 0.002),
                             np.arange(table + 0.005, table + BRACKET_HEIGHT_M - 0.005, 0.005), indexing="ij")
    grid = np.column_stack([gx.ravel(), gy.ravel(), gz.ravel()])
    local = (grid - world_T_object[:3, 3]) @ world_T_object[:3, :3]
    collides = np.any([p.find_simplex(local) >= 0 for p in parts], axis=0)

    def in_rectangles(points, rectangles, grow):
        return np.any([(points[:, 0] > x0 - grow) & (points[:, 0] < x1 + grow) & (points[:, 1] > y0 - grow)
                       & (points[:, 1] < y1 + grow) for (x0, x1), (y0, y1) in rectangles], axis=0)

    inside = in_rectangles(grid, BRACKET_ARMS, 0.0)
    well_inside, well_outside = in_rectangles(grid, BRACKET_ARMS, -0.004), ~in_rectangles(grid, BRACKET_ARMS, 0.006)
    notch = in_rectangles(grid, (BRACKET_NOTCH,), -0.006)
    iou = np.sum(collides & inside) / np.sum(collides | inside)
    print(f"{len(parts)} convex parts; IoU with the true bracket {iou:.3f}; true interior (4 mm in) covered "
          f"{collides[well_inside].mean():.3f}; space 6 mm and more outside it collides {collides[well_outside].mean():.4f}"
          f"; its notch {collides[notch].mean():.4f}")
    assert iou >= 0.75
    assert collides[well_inside].mean() >= 0.98
    assert collides[notch].mean() <= 0.02 and collides[well_outside].mean() <= 0.01
    model = load_scene(twin)
    assert sum(model.geom(g).name.startswith("scanned_object_0_collision") for g in range(model.ngeom)) == len(parts)
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_step(model, data, nstep=500)
    assert all(w.number == 0 for w in data.warning), [(i, w.number) for i, w in enumerate(data.warning) if w.number]


def test_a_missing_scan_bag_is_file_not_found_for_the_node(tmp_path):
    """The twin builder answers a goal with the error's own code (no message matching)."""
    from twinloop_builder.geometry.fusion import ScanBagNotFound
    from twinloop_builder.geometry.scan_bag import scan_frames

    with pytest.raises(ScanBagNotFound, match="no bag at") as missing:
        scan_frames(tmp_path / "nowhere", load_workcell())
    assert missing.value.code == "FILE_NOT_FOUND"


@pytest.mark.parametrize("arguments, says", [
    ("--scan a --held-out b", "--held-out and --select belong to a physics build"),
    ("--scan a --select command", "--held-out and --select belong to a physics build"),
    ("--fit a --calibration wrist.yaml", "--calibration goes with --scan"),
    ("--fit a --scan b", "one of them"),
    ("", "one of them"),
])
def test_a_goal_with_arguments_that_do_not_go_together_is_refused_before_any_ros_start_up(arguments, says):
    done = subprocess.run([sys.executable, "-m", "twinloop_builder.cli", "goal", *arguments.split()],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
