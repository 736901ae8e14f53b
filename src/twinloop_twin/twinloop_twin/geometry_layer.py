"""A twin's measured geometry: what a scan of the cell found, applied on top of the
workcell description when the twin's MuJoCo scene is built.

`inputs/geometry.yaml` of a twin version (written by twinloop_builder's geometry build,
carried on by later versions): the table top's measured height, the box's measured pose
(its start pose in the scene), and the objects found on the table that the description
lacks, each a static box (pose and size) that the robot collides with. Pure Python.
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
            "objects": [{"name": o.name, "position_m": _floats(o.position_m), "quat_wxyz": _floats(o.quat_wxyz),
                         "size_m": _floats(o.size_m)} for o in self.objects],
            "source": self.source,
        }
        return ("# Measured geometry of the cell (twinloop_builder geometry build); applied on top of\n"
                "# the workcell description when the twin's scene is built.\n" + yaml.safe_dump(document, sort_keys=False))


def load_geometry_layer(path: Path | str) -> GeometryLayer:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
        layer = GeometryLayer(
            float(raw["table_top_height_m"]), _vector(raw["box"]["position_m"], 3), _vector(raw["box"]["quat_wxyz"], 4),
            tuple(ScannedObject(str(o["name"]), _vector(o["position_m"], 3), _vector(o["quat_wxyz"], 4),
                                _vector(o["size_m"], 3)) for o in raw.get("objects") or []),
            dict(raw.get("source") or {}))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise GeometryLayerError(f"{path}: not a readable geometry file ({error})") from error
    if not math.isfinite(layer.table_top_height_m):
        raise GeometryLayerError(f"{path}: table_top_height_m must be a finite number")
    for obj in layer.objects:
        if min(obj.size_m) <= 0:
            raise GeometryLayerError(f"{path}: object {obj.name} has a size <= 0: {obj.size_m}")
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
        body = spec.worldbody.add_body(name=f"scanned_{obj.name}", pos=list(obj.position_m), quat=list(obj.quat_wxyz))
        half = [s / 2.0 for s in obj.size_m]
        body.add_geom(name=f"scanned_{obj.name}_collision", type=mujoco.mjtGeom.mjGEOM_BOX, size=half,
                      group=3, rgba=[0.5, 0.5, 0.5, 0.3])
        body.add_geom(name=f"scanned_{obj.name}_visual", type=mujoco.mjtGeom.mjGEOM_BOX, size=half, group=1,
                      contype=0, conaffinity=0, rgba=[0.45, 0.55, 0.7, 1.0])


def _vector(values: Any, n: int) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n or not all(math.isfinite(v) for v in out):
        raise ValueError(f"expected {n} finite numbers, got {values!r}")
    return out


def _floats(values) -> list[float]:
    return [round(float(v), 6) for v in np.asarray(values, float).ravel()]
