"""What a planned motion must keep clear of: a twin version's collision geometry (table,
reconstructed objects, the box, the robot itself) and the envelope's workspace and keep-out
boxes. Pure Python (no rclpy).

The robot's collision meshes are checked with MuJoCo's collision pipeline on the twin's own
scene; the keep-out boxes are added to that scene as solids, so the whole arm stays out of
them, not only the link origins the envelope monitor checks. The monitor's own check
(`cartesian_violation` on `EnvelopeMonitor.link_positions`) runs on every state as well,
its margin grown by the clearance: a state the planner accepts is one the monitor accepts,
and so is what lies between two states the planner checked.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import mujoco
import numpy as np

from twinloop_safety.envelope import (EnvelopeLimits, EnvelopeMonitor, cartesian_regions, cartesian_violation,
                                      load_envelope_limits)
from twinloop_twin.bundle import load_twin
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.nominal import SCENE_FILE, load_twin_workcell
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import build_workcell_spec
from twinloop_twin.workcell import WorkcellDescription, default_config_dir

ROBOT_ROOT = "panda_link0"
TCP_BODY = "panda_hand_tcp"
# Joints that follow another (not commanded): the second finger mirrors the first.
MIMICS = {"panda_finger_joint2": "panda_finger_joint1"}
KEEP_OUT_PREFIX = "keep_out/"
# Body pairs of the robot that touch by design (the fingers meet when the gripper closes).
TOUCHING_BY_DESIGN = frozenset({frozenset({"panda_leftfinger", "panda_rightfinger"})})


@dataclass(frozen=True)
class Obstacle:
    """One solid of the scene that is not the robot, in the world frame, as another collision
    checker takes it (MoveIt's planning scene): `kind` box (size: full extents, m), sphere
    (radius), cylinder (radius, full height), plane (the table's ground plane; size empty),
    or mesh (vertices (k, 3) in the solid's frame, faces (f, 3) vertex indices)."""

    name: str
    kind: str
    size: tuple[float, ...]
    position: np.ndarray  # (3,) m
    rotation: np.ndarray  # (3, 3)
    vertices: np.ndarray | None = None
    faces: np.ndarray | None = None


@dataclass(frozen=True)
class SceneSettings:
    """clearance_m: the least distance between the robot and anything not robot (the
    robot's parts may come as close as touching); allowed: bodies the robot may touch
    (e.g. the box it grasps)."""

    clearance_m: float = 0.01
    allowed: tuple[str, ...] = ()


class PlanningScene:
    """Validity of joint positions (the envelope's commandable joints, in its order)."""

    def __init__(self, spec: mujoco.MjSpec, limits: EnvelopeLimits, kinematics: UrdfTransforms,
                 settings: SceneSettings = SceneSettings(), urdf_xml: str = "") -> None:
        """`spec`: the scene's MuJoCo description (a twin version's scene.xml, or the
        workcell's as built from its description); the keep-out boxes are added to it.
        `urdf_xml`: the robot description the kinematics came from (for another backend)."""
        if settings.clearance_m < 0:
            raise ValueError(f"clearance_m must be >= 0, got {settings.clearance_m}")
        self.limits = limits
        self.settings = settings
        # The monitor's workspace and keep-out check with the clearance added to its margin:
        # a path checked state by state keeps that far inside what the monitor checks along
        # every step, so what lies between two checked states does not cross its boundary.
        self._planning_limits = replace(limits, cartesian_margin_m=limits.cartesian_margin_m + settings.clearance_m)
        self._regions = {True: cartesian_regions(self._planning_limits), False: cartesian_regions(limits)}
        self.joint_names = limits.joint_names
        self.lower = np.array(limits.lower)
        self.upper = np.array(limits.upper)
        self.model = _with_keep_out(spec, limits)
        self.urdf_xml = urdf_xml
        self.data = mujoco.MjData(self.model)
        self.kinematics = kinematics
        self._monitor = EnvelopeMonitor(limits, kinematics)
        model = self.model
        unknown = [j for j in self.joint_names if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j) < 0]
        if unknown:
            raise ValueError(f"the twin's scene has no joints {unknown} of the envelope's joint_names")
        self._qpos = np.array([model.joint(j).qposadr[0] for j in self.joint_names])
        self._mimic = [(model.joint(m).qposadr[0], self.joint_names.index(leader))
                       for m, leader in MIMICS.items() if leader in self.joint_names]
        root = model.body(ROBOT_ROOT).id
        self._robot = np.array([descends(model, b, root) for b in range(model.nbody)])
        allowed = set(settings.allowed)
        unknown = allowed - {model.body(b).name for b in range(model.nbody)}
        if unknown:
            raise ValueError(f"allowed bodies {sorted(unknown)} are not in the twin's scene")
        self._allowed = np.array([model.body(b).name in allowed for b in range(model.nbody)])
        # Contacts are reported out to the clearance: MuJoCo's margin on the robot's geoms.
        for g in range(model.ngeom):
            if self._robot[model.geom_bodyid[g]] and model.geom_contype[g]:
                model.geom_margin[g] = settings.clearance_m
        self.checks = 0

    @classmethod
    def from_twin(cls, twin_path: Path | str, envelope_config: Path | str | None = None,
                  settings: SceneSettings = SceneSettings()) -> "PlanningScene":
        """The scene of a twin version, with the envelope an envelope monitor started with
        `envelope_config` (default config/envelope.yaml) enforces."""
        bundle = load_twin(twin_path)
        urdf_xml = load_twin_workcell(bundle).urdf_xml
        kinematics = UrdfTransforms(urdf_xml)
        limits = load_envelope_limits(envelope_config or default_config_dir() / "envelope.yaml", kinematics)
        return cls(mujoco.MjSpec.from_file(str(bundle.file_path(SCENE_FILE))), limits, kinematics, settings, urdf_xml)

    @classmethod
    def from_workcell(cls, workcell: WorkcellDescription, envelope_config: Path | str | None = None,
                      settings: SceneSettings = SceneSettings()) -> "PlanningScene":
        """The scene the workcell description gives (no twin version needed: its geometry,
        with the nominal physics, which a collision check does not read)."""
        kinematics = UrdfTransforms(workcell.urdf_xml)
        limits = load_envelope_limits(envelope_config or default_config_dir() / "envelope.yaml", kinematics)
        physics = load_physics(default_config_dir() / "nominal_physics.yaml")
        return cls(build_workcell_spec(workcell, physics), limits, kinematics, settings, workcell.urdf_xml)

    def set(self, q: Sequence[float]) -> None:
        q = np.asarray(q, dtype=float)
        self.data.qpos[self._qpos] = q
        for address, leader in self._mimic:
            self.data.qpos[address] = q[leader]
        mujoco.mj_kinematics(self.model, self.data)

    def problem(self, q: Sequence[float], clearance_m: float | None = None) -> str | None:
        """Why joint positions q are not a valid state, or None. `clearance_m`: instead of
        the scene's (0: only touching counts)."""
        self.checks += 1
        clearance = self.settings.clearance_m if clearance_m is None else clearance_m
        q = np.asarray(q, dtype=float)
        if not np.all(np.isfinite(q)):
            return "a joint position is not finite"
        out = np.flatnonzero((q < self.lower - 1e-9) | (q > self.upper + 1e-9))
        if out.size:
            return "beyond the position limits with margin: " + ", ".join(
                f"{self.joint_names[i]}={q[i]:.3f} outside [{self.lower[i]:.3f}, {self.upper[i]:.3f}]" for i in out)
        grown = clearance != 0
        violation = cartesian_violation(self._planning_limits if grown else self.limits,
                                        self.link_positions(q), self._regions[grown])
        if violation is not None:
            return violation.reason.split(";")[0]
        contact = self.contact(q, clearance_m)
        return None if contact is None else f"collision {contact[0]}-{contact[1]} ({contact[2] * 1000:.0f} mm)"

    def link_positions(self, q: Sequence[float]) -> np.ndarray:
        """World positions of the envelope's checked links at q (the monitor's own kinematics)."""
        return self._monitor.link_positions(np.asarray(q, dtype=float))

    def valid(self, q: Sequence[float]) -> bool:
        return self.problem(q) is None

    def contact(self, q: Sequence[float], clearance_m: float | None = None) -> tuple[str, str, float] | None:
        """The first pair of bodies closer than allowed at q (robot-robot: touching;
        robot-scene: the clearance), with their signed distance (m), or None."""
        clearance = self.settings.clearance_m if clearance_m is None else clearance_m
        self.set(q)
        model, data = self.model, self.data
        mujoco.mj_collision(model, data)
        for contact in data.contact[:data.ncon]:
            b1, b2 = model.geom_bodyid[contact.geom1], model.geom_bodyid[contact.geom2]
            robot1, robot2 = self._robot[b1], self._robot[b2]
            if not (robot1 or robot2) or self._allowed[b1] or self._allowed[b2]:
                continue
            names = (model.body(b1).name, model.body(b2).name)
            if robot1 and robot2:
                if contact.dist >= 0 or frozenset(names) in TOUCHING_BY_DESIGN:
                    continue
            elif contact.dist >= clearance:
                continue
            if model.geom(contact.geom1).name.startswith(KEEP_OUT_PREFIX):
                names = (model.geom(contact.geom1).name, names[1])
            elif model.geom(contact.geom2).name.startswith(KEEP_OUT_PREFIX):
                names = (names[0], model.geom(contact.geom2).name)
            return names[0], names[1], float(contact.dist)
        return None

    def obstacles(self) -> list[Obstacle]:
        """Every colliding solid that is not the robot's nor an allowed body's, keep-out boxes
        included, where it stands (none of them moves with the robot). Capsules and
        ellipsoids are given as the cylinder or box that bounds them."""
        model, data = self.model, self.data
        self.set(np.clip(np.zeros(len(self.joint_names)), self.lower, self.upper))
        out = []
        for g in range(model.ngeom):
            body = model.geom_bodyid[g]
            if self._robot[body] or self._allowed[body] or not (model.geom_contype[g] or model.geom_conaffinity[g]):
                continue
            name = model.geom(g).name or f"{model.body(body).name}/geom{g}"
            kind, size = int(model.geom_type[g]), model.geom_size[g]
            position, rotation = data.geom_xpos[g].copy(), data.geom_xmat[g].reshape(3, 3).copy()
            geom = mujoco.mjtGeom
            if kind == geom.mjGEOM_BOX:
                out.append(Obstacle(name, "box", tuple(float(2 * v) for v in size), position, rotation))
            elif kind == geom.mjGEOM_SPHERE:
                out.append(Obstacle(name, "sphere", (float(size[0]),), position, rotation))
            elif kind == geom.mjGEOM_CYLINDER:
                out.append(Obstacle(name, "cylinder", (float(size[0]), float(2 * size[1])), position, rotation))
            elif kind == geom.mjGEOM_CAPSULE:
                out.append(Obstacle(name, "cylinder", (float(size[0]), float(2 * (size[1] + size[0]))), position,
                                    rotation))
            elif kind == geom.mjGEOM_ELLIPSOID:
                out.append(Obstacle(name, "box", tuple(float(2 * v) for v in size), position, rotation))
            elif kind == geom.mjGEOM_PLANE:
                out.append(Obstacle(name, "plane", (), position, rotation))
            elif kind == geom.mjGEOM_MESH:
                mesh = model.geom_dataid[g]
                first, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
                face, faces = model.mesh_faceadr[mesh], model.mesh_facenum[mesh]
                out.append(Obstacle(name, "mesh", (), position, rotation,
                                    model.mesh_vert[first:first + count].copy(),
                                    model.mesh_face[face:face + faces].copy()))
        return out

    def tcp_pose(self, q: Sequence[float], body: str = TCP_BODY) -> tuple[np.ndarray, np.ndarray]:
        self.set(q)
        b = self.model.body(body).id
        return self.data.xpos[b].copy(), self.data.xmat[b].reshape(3, 3).copy()


def _with_keep_out(spec: mujoco.MjSpec, limits: EnvelopeLimits) -> mujoco.MjModel:
    """The scene with each keep-out box as a solid of the world."""
    for box in limits.keep_out:
        spec.worldbody.add_geom(name=KEEP_OUT_PREFIX + box.name, type=mujoco.mjtGeom.mjGEOM_BOX,
                                size=[s / 2 for s in box.size], pos=list(box.center), contype=1, conaffinity=1,
                                group=4, rgba=[1.0, 0.3, 0.2, 0.3])
    return spec.compile()


def descends(model: mujoco.MjModel, body: int, root: int) -> bool:
    """Whether `body` is `root` or lies below it in the kinematic tree."""
    while body > 0:
        if body == root:
            return True
        body = model.body_parentid[body]
    return False
