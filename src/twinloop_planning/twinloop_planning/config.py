"""config/planning.yaml: the planner's and the scene's settings. Pure Python (no rclpy)."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml

from twinloop_planning.planner import PlannerSettings, PlanningError
from twinloop_planning.scene import SceneSettings
from twinloop_twin.workcell import default_config_dir


class PlanningConfigError(ValueError):
    """config/planning.yaml is malformed; the message names the file, the key and the fix."""


def load_planning_config(path: Path | str | None = None) -> tuple[PlannerSettings, SceneSettings]:
    path = Path(path) if path else default_config_dir() / "planning.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise PlanningConfigError(f"cannot read the planning settings {path}: {error}") from error
    if not isinstance(raw, dict) or set(raw) - {"planner", "scene"}:
        raise PlanningConfigError(f"{path}: expected the sections 'planner' and 'scene', got {list(raw)}")
    planner = _section(path, raw, "planner", PlannerSettings)
    scene = _section(path, raw, "scene", SceneSettings)
    try:
        planner_settings = PlannerSettings(**planner)
    except PlanningError as error:
        raise PlanningConfigError(f"{path}: planner: {error}") from error
    if "allowed" in scene:
        scene["allowed"] = tuple(str(name) for name in scene["allowed"] or ())
    if "clearance_m" in scene and not scene["clearance_m"] >= 0:
        raise PlanningConfigError(f"{path}: scene.clearance_m must be >= 0, got {scene['clearance_m']}")
    return planner_settings, SceneSettings(**scene)


def _section(path: Path, raw: dict, name: str, settings_class) -> dict:
    section = raw.get(name) or {}
    if not isinstance(section, dict):
        raise PlanningConfigError(f"{path}: '{name}' must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(settings_class)}
    unknown = set(section) - set(fields)
    if unknown:
        raise PlanningConfigError(f"{path}: {name} has unknown keys {sorted(unknown)}; known: {sorted(fields)}")
    out = {}
    for key, value in section.items():
        default = fields[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise PlanningConfigError(f"{path}: {name}.{key} must be true or false, got {value!r}")
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            if value is None and key in ("seed", "max_velocity_rad_s"):
                value = math.inf if key == "max_velocity_rad_s" else None
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PlanningConfigError(f"{path}: {name}.{key} must be a finite number, got {value!r}")
        elif isinstance(default, str) and not isinstance(value, str):
            raise PlanningConfigError(f"{path}: {name}.{key} must be a string, got {value!r}")
        out[key] = value
    return out
