"""A twin's measured geometry: what a scan of the cell found, applied on top of the
workcell description when the twin's MuJoCo scene is built.

`inputs/geometry.yaml` of a twin version (written by twinloop_builder's geometry build,
carried on by later versions): the table top's measured height, the box's measured pose
(its start pose in the scene), and the objects found on the table that the description
lacks, each static: its pose and bounding size, and where the scan gave them its convex
collision parts and a visual mesh (else a box of that size for both). Pure Python.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import yaml

GEOMETRY_FILE = "inputs/geometry.yaml"
FORMAT_VERSION = 1


class GeometryLayerError(ValueError):
    """A geometry file that cannot be applied; the message says what is wrong in it."""


@dataclass(frozen=True)
class ScannedObject:
    name: str
    position_m: tuple[float, float, float]  # centre, world
    quat_wxyz: tuple[float, float, float, float]
    size_m: tuple[float, float, float]  # full extents
    # convex collision parts, each its vertices in the object's frame (the simulator takes
    # each part's convex hull); none: the bounding box collides
    collision_parts: tuple[tuple[tuple[float, float, float], ...], ...] = ()
    # a light visual mesh in the object's frame: (vertices, triangles); none: the bounding box
    visual_vertices: tuple[tuple[float, float, float], ...] = ()
    visual_triangles: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def from_arrays(cls, name: str, position_m, quat_wxyz, size_m, collision_parts=(), visual_vertices=(),
                    visual_triangles=()) -> ScannedObject:
        """From array-likes (numpy arrays, or lists read from YAML); ValueError on a wrong
        length or a number that is not finite."""
        return cls(str(name), _vector(position_m, 3), _vector(quat_wxyz, 4), _vector(size_m, 3),
                   tuple(tuple(_vector(v, 3) for v in part) for part in collision_parts),
                   tuple(_vector(v, 3) for v in visual_vertices),
                   tuple(tuple(int(i) for i in _vector(t, 3)) for t in visual_triangles))


@dataclass(frozen=True)
class GeometryLayer:
    table_top_height_m: float
    box_position_m: tuple[float, float, float]
    box_quat_wxyz: tuple[float, float, float, float]
    objects: tuple[ScannedObject, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)  # scan bag / frames, calibration, measurements

    def to_yaml(self) -> str:
        document = {
            "format_version": FORMAT_VERSION,
            "table_top_height_m": round(float(self.table_top_height_m), 6),
            "box": {"position_m": _floats(self.box_position_m), "quat_wxyz": _floats(self.box_quat_wxyz)},
            "objects": [_object_document(o) for o in self.objects],
            "source": self.source,
        }
        return ("# Measured geometry of the cell (twinloop_builder geometry build); applied on top of\n"
                "# the workcell description when the twin's scene is built.\n"
                + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=120))


def load_geometry_layer(path: Path | str) -> GeometryLayer:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
        layer = GeometryLayer(
            float(raw["table_top_height_m"]), _vector(raw["box"]["position_m"], 3), _vector(raw["box"]["quat_wxyz"], 4),
            tuple(_scanned_object(o) for o in raw.get("objects") or []),
            dict(raw.get("source") or {}))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise GeometryLayerError(f"{path}: not a readable geometry file ({error})") from error
    if not math.isfinite(layer.table_top_height_m):
        raise GeometryLayerError(f"{path}: table_top_height_m must be a finite number")
    for obj in layer.objects:
        if min(obj.size_m) <= 0:
            raise GeometryLayerError(f"{path}: object {obj.name} has a size <= 0: {obj.size_m}")
        if any(len(part) < 4 for part in obj.collision_parts):
            raise GeometryLayerError(f"{path}: a collision part of object {obj.name} has under 4 vertices")
        if obj.visual_triangles and not 0 <= np.min(obj.visual_triangles) <= np.max(obj.visual_triangles) < len(obj.visual_vertices):
            raise GeometryLayerError(f"{path}: object {obj.name}'s visual mesh names a vertex it does not have")
    return layer


def with_measured_box(workcell, layer: GeometryLayer):
    """The workcell description with the box's start pose as measured."""
    box = dataclasses.replace(workcell.box, world_position_m=tuple(layer.box_position_m),
                              world_quat_wxyz=tuple(layer.box_quat_wxyz))
    return dataclasses.replace(workcell, box=box)


def apply_to_spec(spec: mujoco.MjSpec, layer: GeometryLayer, *, table_body: str = "table") -> None:
    """Move the table to its measured height and add the scanned objects as static boxes.
    (The box's start pose is the workcell description's; `with_measured_box` sets it.)"""
    table = spec.body(table_body)
    table.pos = [table.pos[0], table.pos[1], layer.table_top_height_m]
    for obj in layer.objects:
        name = f"scanned_{obj.name}"
        body = spec.worldbody.add_body(name=name, pos=list(obj.position_m), quat=list(obj.quat_wxyz))
        half = [s / 2.0 for s in obj.size_m]
        collision = dict(group=3, rgba=[0.5, 0.5, 0.5, 0.3])
        if obj.collision_parts:
            for k, part in enumerate(obj.collision_parts):
                spec.add_mesh(name=f"{name}_part{k}", uservert=np.ravel(part).tolist())
                body.add_geom(name=f"{name}_collision{k}", type=mujoco.mjtGeom.mjGEOM_MESH, meshname=f"{name}_part{k}",
                              **collision)
        else:
            body.add_geom(name=f"{name}_collision", type=mujoco.mjtGeom.mjGEOM_BOX, size=half, **collision)
        visual = dict(group=1, contype=0, conaffinity=0, rgba=[0.45, 0.55, 0.7, 1.0])
        if obj.visual_triangles:
            spec.add_mesh(name=f"{name}_visual", uservert=np.ravel(obj.visual_vertices).tolist(),
                          userface=np.ravel(obj.visual_triangles).tolist())
            body.add_geom(name=f"{name}_visual", type=mujoco.mjtGeom.mjGEOM_MESH, meshname=f"{name}_visual", **visual)
        else:
            body.add_geom(name=f"{name}_visual", type=mujoco.mjtGeom.mjGEOM_BOX, size=half, **visual)


def _object_document(obj: ScannedObject) -> dict[str, Any]:
    document = {"name": obj.name, "position_m": _floats(obj.position_m), "quat_wxyz": _floats(obj.quat_wxyz),
                "size_m": _floats(obj.size_m)}
    if obj.collision_parts:
        document["collision_parts"] = [[_floats(v) for v in part] for part in obj.collision_parts]
    if obj.visual_triangles:
        document["visual_mesh"] = {"vertices": [_floats(v) for v in obj.visual_vertices],
                                   "triangles": [[int(i) for i in t] for t in obj.visual_triangles]}
    return document


def _scanned_object(raw: dict[str, Any]) -> ScannedObject:
    visual = raw.get("visual_mesh") or {}
    return ScannedObject.from_arrays(raw["name"], raw["position_m"], raw["quat_wxyz"], raw["size_m"],
                                     raw.get("collision_parts") or (), visual.get("vertices") or (),
                                     visual.get("triangles") or ())


def _vector(values: Any, n: int) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n or not all(math.isfinite(v) for v in out):
        raise ValueError(f"expected {n} finite numbers, got {values!r}")
    return out


def _floats(values) -> list[float]:
    return [round(float(v), 6) for v in np.asarray(values, float).ravel()]
