"""A scan's table and objects into the next twin version's scene (the geometry layer).

From a segmentation of a fused scan: the table top's measured height, the box (the
described object whose size the scan matches) at its measured pose, and every other
object resting on the table that is not a part of the described cell (the board, the
static camera's stand) as a static object: its solid closed down to the table, split into
convex collision parts (coacd), with a decimated visual mesh (geometry.collision). Physics, calibration and the rest of the
description are the parent version's. The measured sizes are checked against the
description (the box's edges, the table's height): a scale error of the depth or of the
camera poses shows there first.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import open3d as o3d
import yaml
from scipy.spatial.transform import Rotation

from twinloop_twin.bundle import Provenance, SourceBag, TwinBundle, load_twin_version, write_twin_version
from twinloop_twin.geometry_layer import GeometryLayer, ScannedObject
from twinloop_twin.nominal import SCENE_FILE, load_scene, load_twin_workcell, scene_files
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import ROBOT_ROOT_BODY, SCENE_BODIES

from twinloop_builder.geometry.collision import CollisionSettings, ObjectMeshError, ObjectMeshes, object_meshes
from twinloop_builder.geometry.fusion import FusedSurface
from twinloop_builder.geometry.objects import Segmentation, TableObject

SURFACE_FILE = "geometry/scan_surface.ply"
REPORT_FILE = "geometry/report.yaml"


class GeometryBuildError(ValueError):
    """The scan cannot make a geometry layer; the message says what was missing."""


@dataclass(frozen=True)
class AssemblySettings:
    box_size_tolerance_m: float = 0.01  # m, a scanned object is the box when each edge is this close
    known_margin_m: float = 0.02  # m, an object whose centre is this close to a described body is that body
    max_table_offset_m: float = 0.03  # m, a table measured farther from the described height: refused
    collision: CollisionSettings = CollisionSettings()


def geometry_layer(segmentation: Segmentation, parent_model: mujoco.MjModel, box_size_m, described_table_m: float,
                   settings: AssemblySettings = AssemblySettings(),
                   box_quat_wxyz=(1.0, 0.0, 0.0, 0.0)) -> tuple[GeometryLayer, dict[str, Any]]:
    """(the layer, a report of what each scanned object was taken for and the scale checks).
    `box_quat_wxyz`: the box's described orientation; of the box's symmetric orientations the
    scan cannot tell apart, the layer takes the one nearest it."""
    table_m = float(-segmentation.plane[3] / segmentation.plane[2])
    if abs(table_m - described_table_m) > settings.max_table_offset_m:
        raise GeometryBuildError(f"the scanned table top is at {table_m:.3f} m, {table_m - described_table_m:+.3f} m "
                                 f"from the described {described_table_m:.3f} m: check the camera poses (hand-eye "
                                 "calibration) and the depth scale before building geometry from this scan")
    size = np.sort(np.asarray(box_size_m, float))
    candidates = [o for o in segmentation.objects
                  if np.all(np.abs(np.sort(o.size_m) - size) <= settings.box_size_tolerance_m)]
    if not candidates:
        seen = [np.round(o.size_m * 1e3).tolist() for o in segmentation.objects]
        raise GeometryBuildError(f"no scanned object has the box's size {np.round(size * 1e3).tolist()} mm "
                                 f"(within {settings.box_size_tolerance_m * 1e3:.0f} mm); objects seen: {seen} mm. "
                                 "Is the box in the scanned views?")
    box = max(candidates, key=lambda o: len(o.points))
    known = _described_bodies(parent_model)
    report: dict[str, Any] = {"table_top_height_m": round(table_m, 5),
                              "table_offset_from_description_mm": round((table_m - described_table_m) * 1e3, 2),
                              "box": {"size_mm": np.round(box.size_m * 1e3, 2).tolist(),
                                      "size_ratio_to_description": round(float(np.mean(np.sort(box.size_m) / size)), 4)},
                              "objects": []}
    scanned = []
    for obj in segmentation.objects:
        if obj is box:
            continue
        centre = obj.world_T_object[:3, 3]
        match = next((name for name, (low, high) in known.items()
                      if np.all(centre > low - settings.known_margin_m) and np.all(centre < high + settings.known_margin_m)),
                     None)
        entry = {"centre_m": np.round(centre, 4).tolist(), "size_mm": np.round(obj.size_m * 1e3, 1).tolist()}
        if match:
            report["objects"].append({**entry, "taken_for": f"described body {match}"})
            continue
        name = f"object_{len(scanned)}"
        try:
            meshes = object_meshes(obj, settings.collision)
            entry["collision"] = {"convex_parts": len(meshes.parts), "solid_volume_cm3": round(meshes.volume_m3 * 1e6, 1),
                                  "visual_triangles": len(meshes.visual_triangles)}
        except ObjectMeshError as error:
            meshes = None
            entry["collision"] = f"its bounding box ({error})"
        scanned.append(_scanned(name, obj, meshes))
        report["objects"].append({**entry, "taken_for": f"new static object {name}"})
    position, _ = _pose(box)
    quat = _box_quat(box, np.asarray(box_size_m, float), box_quat_wxyz, settings.box_size_tolerance_m)
    # the box rests on the measured table: its centre half its described height above it
    position = (position[0], position[1], table_m + float(np.asarray(box_size_m, float)[2]) / 2.0)
    layer = GeometryLayer(table_m, position, quat, tuple(scanned))
    return layer, report


def build_geometry_twin(root: Path | str, workcell: str, surface: FusedSurface, segmentation: Segmentation, *,
                        parent_version: int | None = None, source_bags: tuple[SourceBag, ...] = (),
                        source: dict[str, Any] | None = None,
                        settings: AssemblySettings = AssemblySettings()) -> tuple[TwinBundle, dict[str, Any]]:
    """Write the next version of `workcell`: the parent's, with the scanned geometry layer."""
    parent = load_twin_version(root, workcell, parent_version)
    description = load_twin_workcell(parent)
    physics = load_physics(parent.file_path("inputs/physics.yaml"))
    layer, report = geometry_layer(segmentation, load_scene(parent), description.box.size_m,
                                   description.table_top_height_m, settings, description.box.world_quat_wxyz)
    layer = GeometryLayer(layer.table_top_height_m, layer.box_position_m, layer.box_quat_wxyz, layer.objects,
                          dict(source or {}))
    files: dict[str, bytes | Path] = scene_files(description, physics, layer)
    for name in ("inputs/physics.yaml", "inputs/workcell.yaml", "inputs/workcell_description.urdf"):
        files[name] = parent.file_path(name)
    with tempfile.TemporaryDirectory() as scratch:
        mesh_path = Path(scratch) / "scan_surface.ply"
        o3d.io.write_triangle_mesh(str(mesh_path), surface.to_open3d(), write_ascii=False)
        files[SURFACE_FILE] = mesh_path.read_bytes()
    files[REPORT_FILE] = yaml.safe_dump(report, sort_keys=False).encode()
    provenance = Provenance(
        created_by="geometry", parent_version=parent.version, source_bags=source_bags,
        calibration=parent.manifest.provenance.calibration,
        note=(f"geometry from a scan of {surface.frames_used} frames: table top {layer.table_top_height_m:.4f} m, "
              f"box at {np.round(layer.box_position_m, 4).tolist()}, {len(layer.objects)} new static object(s); "
              f"physics of v{parent.version}; see {REPORT_FILE}"))
    twin = write_twin_version(root, workcell, parameters=parent.parameters, provenance=provenance, files=files,
                              calibration=dict(parent.manifest.calibration or {}) or None)
    mujoco.MjModel.from_xml_path(str(twin.file_path(SCENE_FILE)))  # it loads
    return twin, report


def _described_bodies(model: mujoco.MjModel) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """World AABBs of the described bodies an object on the table may be: the cell's (board,
    the static camera's stand) and the robot's at its home pose (its base stands on the table)."""
    data = mujoco.MjData(model)
    if model.nkey and mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, "home") >= 0:
        mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_forward(model, data)
    out = {}
    for body in range(1, model.nbody):
        name = model.body(body).name
        if name in ("table", "box") or name not in SCENE_BODIES and not _is_robot(model, body):
            continue
        corners = []
        for geom in np.flatnonzero(model.geom_bodyid == body):
            centre, half = model.geom_aabb[geom, :3], model.geom_aabb[geom, 3:]
            rotation = data.geom_xmat[geom].reshape(3, 3)
            for signs in np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).T.reshape(-1, 3):
                corners.append(data.geom_xpos[geom] + rotation @ (centre + signs * half))
        if corners:
            corners = np.array(corners)
            out[name] = (corners.min(axis=0), corners.max(axis=0))
    return out


def _is_robot(model: mujoco.MjModel, body: int) -> bool:
    root = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, ROBOT_ROOT_BODY)
    while body > 0:
        if body == root:
            return True
        body = model.body_parentid[body]
    return False


def _pose(obj: TableObject) -> tuple[tuple[float, float, float], tuple[float, float, float, float]]:
    x, y, z, w = Rotation.from_matrix(obj.world_T_object[:3, :3]).as_quat()
    return tuple(float(v) for v in obj.world_T_object[:3, 3]), (float(w), float(x), float(y), float(z))


def _box_quat(box: TableObject, size_m: np.ndarray, described_wxyz, tolerance_m: float) -> tuple[float, ...]:
    """The scanned box's orientation (w, x, y, z): its frame turned about the table's normal
    by the quarter turn whose edges match the described size (a scan sees the box's faces,
    not which of its edges is its x) and that lies nearest the described orientation."""
    w, x, y, z = (float(v) for v in described_wxyz)
    described = Rotation.from_quat([x, y, z, w])
    best, best_angle = None, np.inf
    for quarter in range(4):
        turned = box.world_T_object[:3, :3] @ Rotation.from_euler("z", quarter * np.pi / 2).as_matrix()
        extents = box.size_m[[1, 0, 2]] if quarter % 2 else box.size_m
        angle = (described.inv() * Rotation.from_matrix(turned)).magnitude()
        if np.all(np.abs(extents - size_m) <= tolerance_m) and angle < best_angle:
            best, best_angle = turned, angle
    if best is None:  # (the box was found by its sorted extents, so one of the turns matches them)
        best = box.world_T_object[:3, :3]
    qx, qy, qz, qw = Rotation.from_matrix(best).as_quat()
    return float(qw), float(qx), float(qy), float(qz)


def _scanned(name: str, obj: TableObject, meshes: ObjectMeshes | None) -> ScannedObject:
    position, quat = _pose(obj)
    if meshes is None:
        return ScannedObject.from_arrays(name, position, quat, obj.size_m)
    return ScannedObject.from_arrays(name, position, quat, obj.size_m, meshes.parts, meshes.visual_vertices,
                                     meshes.visual_triangles)
