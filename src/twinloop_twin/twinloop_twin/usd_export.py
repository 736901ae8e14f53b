"""Export a twin version to USD (usd-core) for Isaac Sim: geometry, rigid bodies, joints,
drives, materials, cameras and the twin's identified physics.

Written here because the maintained MJCF-to-USD converter (mujoco-usd-converter) requires
mujoco < 3.17 and the suite runs MuJoCo 4. The export starts from the twin's compiled
MuJoCo model at its home keyframe, so what Isaac Sim gets is what MuJoCo simulates:
- bodies with mass become rigid bodies (UsdPhysics.RigidBodyAPI + MassAPI), massless
  frames (camera optical frames, the TCP) nest under their rigid ancestor, bodies welded
  to the world (table, camera stand, board) become static colliders;
- a hinge/slide becomes a revolute/prismatic joint to the nearest rigid ancestor, with an
  angular/linear drive whose stiffness/damping are the twin's kp/kv (converted to USD's
  per-degree units for angular drives); bodies welded to a moving ancestor get a fixed joint;
- joint friction loss, damping, armature and the command delay, which UsdPhysics has no
  schema for, are written as `twinloop:` attributes that scripts/isaac applies with PhysX.
Pure Python (no rclpy).
"""
from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np
from pxr import Gf, Sdf, Usd, UsdGeom, UsdPhysics, UsdShade, Vt

from twinloop_twin.bundle import TwinBundle
from twinloop_twin.nominal import load_scene, load_twin_workcell
from twinloop_twin.scene import COMMAND_JOINT_TO_ACTUATOR, acting_command_delay

ROOT_PATH = "/World/twin"
MASSLESS_KG = 1e-6
# USD camera apertures/focal length are in millimetres; one pixel is this many mm.
PIXEL_PITCH_MM = 0.003


def export_twin_usd(bundle: TwinBundle, output: Path) -> Path:
    model = load_scene(bundle)
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_kinematics(model, data)
    stage = Usd.Stage.CreateNew(str(output))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.Scene.Define(stage, "/World/physicsScene").CreateGravityMagnitudeAttr(
        float(np.linalg.norm(model.opt.gravity)))
    root = UsdGeom.Xform.Define(stage, ROOT_PATH)
    stage.SetDefaultPrim(stage.GetPrimAtPath("/World"))
    stage.GetRootLayer().customLayerData = {
        "twinloop:workcell": bundle.workcell, "twinloop:version": bundle.version,
        "twinloop:parameters": {name.replace(".", ":"): p.mean for name, p in bundle.parameters.items()},
    }
    exporter = _Exporter(stage, model, data, bundle)
    exporter.bodies()
    exporter.joints()
    exporter.cameras(load_twin_workcell(bundle).cameras)
    root.GetPrim().CreateAttribute("twinloop:commandDelay_s", Sdf.ValueTypeNames.Double).Set(
        # the whole-step delay the twin's MuJoCo scene acts (its parameter may be a step's middle)
        acting_command_delay(float(bundle.parameters["command.delay_s"].mean))
        if "command.delay_s" in bundle.parameters else 0.0)
    stage.GetRootLayer().Save()
    return output


class _Exporter:
    def __init__(self, stage: Usd.Stage, model: mujoco.MjModel, data: mujoco.MjData, bundle: TwinBundle) -> None:
        self.stage, self.model, self.data, self.bundle = stage, model, data, bundle
        self.prim_of_body: dict[int, str] = {}
        self.rigid_ancestor: dict[int, int] = {}  # body -> nearest rigid ancestor (0 = world)
        self.materials: dict[float, UsdShade.Material] = {}

    # ---------------------------------------------------------------- bodies
    def bodies(self) -> None:
        for body in range(1, self.model.nbody):
            parent = int(self.model.body_parentid[body])
            dynamic = self._moves(body) or self._has_moving_descendant(body)
            if not dynamic or self.model.body_mass[body] > MASSLESS_KG:
                # rigid bodies and static colliders sit flat under the root, at their world pose
                path = f"{ROOT_PATH}/{_name(self.model, body)}"
                self._xform(path, self._world_pose(body))
                if dynamic:
                    self._rigid(path, body)
                self.rigid_ancestor[body] = body if dynamic else 0
            else:
                # a massless moving frame (optical frame, TCP) rides along inside its rigid ancestor
                anchor = self.rigid_ancestor[parent]
                path = f"{self.prim_of_body[anchor] if anchor else ROOT_PATH}/{_name(self.model, body)}"
                self._xform(path, np.linalg.inv(self._world_pose(anchor)) @ self._world_pose(body))
                self.rigid_ancestor[body] = anchor
            self.prim_of_body[body] = path
            for geom in np.nonzero(self.model.geom_bodyid == body)[0]:
                self._geom(path, int(geom))

    def _moves(self, body: int) -> bool:
        """True if a joint anywhere up the chain lets the body move."""
        while body > 0:
            if self.model.body_jntnum[body] > 0:
                return True
            body = int(self.model.body_parentid[body])
        return False

    def _has_moving_descendant(self, body: int) -> bool:
        """True for the base of a mechanism (the robot's link0): it roots an articulation."""
        children = np.nonzero(self.model.body_parentid == body)[0]
        return any(self.model.body_jntnum[c] > 0 or self._has_moving_descendant(int(c)) for c in children if c != body)

    def _world_pose(self, body: int) -> np.ndarray:
        pose = np.eye(4)
        if body > 0:
            pose[:3, :3] = self.data.xmat[body].reshape(3, 3)
            pose[:3, 3] = self.data.xpos[body]
        return pose

    def _xform(self, path: str, pose: np.ndarray) -> UsdGeom.Xform:
        xform = UsdGeom.Xform.Define(self.stage, path)
        xform.AddTransformOp().Set(Gf.Matrix4d(pose.T.tolist()))  # USD matrices are row-vector
        return xform

    def _rigid(self, path: str, body: int) -> None:
        prim = self.stage.GetPrimAtPath(path)
        UsdPhysics.RigidBodyAPI.Apply(prim)
        mass = UsdPhysics.MassAPI.Apply(prim)
        mass.CreateMassAttr(float(self.model.body_mass[body]))
        mass.CreateCenterOfMassAttr(Gf.Vec3f(*self.model.body_ipos[body].tolist()))
        mass.CreateDiagonalInertiaAttr(Gf.Vec3f(*self.model.body_inertia[body].tolist()))
        w, x, y, z = self.model.body_iquat[body].tolist()
        mass.CreatePrincipalAxesAttr(Gf.Quatf(w, x, y, z))

    def _geom(self, body_path: str, geom: int) -> None:
        model = self.model
        kind = model.geom_type[geom]
        collider = bool(model.geom_contype[geom] or model.geom_conaffinity[geom])
        path = f"{body_path}/{'collision' if collider else 'visual'}_{geom}"
        size = model.geom_size[geom]
        if kind == mujoco.mjtGeom.mjGEOM_BOX or kind == mujoco.mjtGeom.mjGEOM_PLANE:
            prim = UsdGeom.Cube.Define(self.stage, path)
            prim.CreateSizeAttr(2.0)
            half = size if kind == mujoco.mjtGeom.mjGEOM_BOX else [size[0] or 5.0, size[1] or 5.0, 0.001]
            scale = Gf.Vec3f(*[float(h) for h in half])
        elif kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
            prim = UsdGeom.Cylinder.Define(self.stage, path)
            prim.CreateRadiusAttr(float(size[0]))
            prim.CreateHeightAttr(float(2 * size[1]))
            prim.CreateAxisAttr("Z")
            scale = None
        elif kind == mujoco.mjtGeom.mjGEOM_SPHERE:
            prim = UsdGeom.Sphere.Define(self.stage, path)
            prim.CreateRadiusAttr(float(size[0]))
            scale = None
        elif kind == mujoco.mjtGeom.mjGEOM_MESH:
            prim = self._mesh(path, int(model.geom_dataid[geom]))
            scale = None
        else:
            return
        xform = UsdGeom.Xformable(prim)
        xform.AddTranslateOp().Set(Gf.Vec3d(*model.geom_pos[geom].tolist()))
        w, x, y, z = model.geom_quat[geom].tolist()
        xform.AddOrientOp().Set(Gf.Quatf(w, x, y, z))
        if scale is not None:
            xform.AddScaleOp().Set(scale)
        rgba = model.geom_rgba[geom]
        UsdGeom.Gprim(prim).CreateDisplayColorAttr(Vt.Vec3fArray([Gf.Vec3f(*rgba[:3].tolist())]))
        if collider:
            UsdGeom.Imageable(prim).CreatePurposeAttr(UsdGeom.Tokens.guide)
            UsdPhysics.CollisionAPI.Apply(prim.GetPrim())
            if kind == mujoco.mjtGeom.mjGEOM_MESH:
                UsdPhysics.MeshCollisionAPI.Apply(prim.GetPrim()).CreateApproximationAttr("convexHull")
            self._bind_friction(prim.GetPrim(), float(model.geom_friction[geom, 0]))

    def _mesh(self, path: str, mesh: int) -> UsdGeom.Mesh:
        model = self.model
        start, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
        faces_start, faces = model.mesh_faceadr[mesh], model.mesh_facenum[mesh]
        prim = UsdGeom.Mesh.Define(self.stage, path)
        prim.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(model.mesh_vert[start:start + count].astype(np.float32)))
        indices = model.mesh_face[faces_start:faces_start + faces].reshape(-1).astype(np.int32)
        prim.CreateFaceVertexIndicesAttr(Vt.IntArray.FromNumpy(indices))
        prim.CreateFaceVertexCountsAttr(Vt.IntArray([3] * int(faces)))
        prim.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)
        return prim

    def _bind_friction(self, prim: Usd.Prim, friction: float) -> None:
        key = round(friction, 6)
        if key not in self.materials:
            material = UsdShade.Material.Define(self.stage, f"/World/materials/friction_{len(self.materials)}")
            api = UsdPhysics.MaterialAPI.Apply(material.GetPrim())
            api.CreateStaticFrictionAttr(friction)
            api.CreateDynamicFrictionAttr(friction)
            self.materials[key] = material
        UsdShade.MaterialBindingAPI.Apply(prim).Bind(self.materials[key], UsdShade.Tokens.weakerThanDescendants,
                                                      "physics")

    # ---------------------------------------------------------------- joints
    def joints(self) -> None:
        model = self.model
        for body in range(1, model.nbody):
            if self.rigid_ancestor.get(body) != body:
                continue
            anchor = self._rigid_parent(body)
            if model.body_jntnum[body] == 0:
                self._fixed_joint(body, anchor)
                if anchor == 0:
                    # a mechanism welded to the world: the root of a fixed-base articulation
                    UsdPhysics.ArticulationRootAPI.Apply(self.stage.GetPrimAtPath(self.prim_of_body[body]))
                continue
            joint = int(model.body_jntadr[body])
            kind = model.jnt_type[joint]
            if kind == mujoco.mjtJoint.mjJNT_FREE:
                continue
            path = f"{ROOT_PATH}/joints/{model.joint(joint).name}"
            usd_joint = (UsdPhysics.RevoluteJoint if kind == mujoco.mjtJoint.mjJNT_HINGE
                         else UsdPhysics.PrismaticJoint).Define(self.stage, path)
            usd_joint.CreateAxisAttr("X")
            self._connect(usd_joint, body, anchor, model.jnt_pos[joint], model.jnt_axis[joint])
            angular = kind == mujoco.mjtJoint.mjJNT_HINGE
            to_usd = math.degrees(1.0) if angular else 1.0  # angular limits/targets in degrees
            low, high = model.jnt_range[joint]
            usd_joint.CreateLowerLimitAttr(float(low * to_usd))
            usd_joint.CreateUpperLimitAttr(float(high * to_usd))
            self._joint_physics(usd_joint.GetPrim(), joint, angular, to_usd)
        for equality in range(model.neq):
            if model.eq_type[equality] == mujoco.mjtEq.mjEQ_JOINT:
                follower, leader = model.joint(int(model.eq_obj1id[equality])).name, \
                    model.joint(int(model.eq_obj2id[equality])).name
                prim = self.stage.GetPrimAtPath(f"{ROOT_PATH}/joints/{follower}")
                if prim:  # PhysxMimicJointAPI is not in usd-core: the Isaac script applies this
                    prim.CreateAttribute("twinloop:mimicJoint", Sdf.ValueTypeNames.String).Set(leader)

    def _rigid_parent(self, body: int) -> int:
        parent = int(self.model.body_parentid[body])
        return self.rigid_ancestor.get(parent, 0)

    def _fixed_joint(self, body: int, anchor: int) -> None:
        joint = UsdPhysics.FixedJoint.Define(self.stage, f"{ROOT_PATH}/joints/fixed_{_name(self.model, body)}")
        self._connect(joint, body, anchor, np.zeros(3), np.array([1.0, 0.0, 0.0]))

    def _connect(self, joint: UsdPhysics.Joint, body: int, anchor: int, position_in_body: np.ndarray,
                 axis_in_body: np.ndarray) -> None:
        # The joint frame: at the joint position, its X axis along the joint axis; expressed
        # in both bodies so that the frames coincide at the home configuration.
        body_T_joint = np.eye(4)
        body_T_joint[:3, :3] = _rotation_x_to(axis_in_body)
        body_T_joint[:3, 3] = position_in_body
        anchor_T_joint = np.linalg.inv(self._world_pose(anchor)) @ self._world_pose(body) @ body_T_joint
        if anchor:
            joint.CreateBody0Rel().SetTargets([self.prim_of_body[anchor]])
        joint.CreateBody1Rel().SetTargets([self.prim_of_body[body]])
        joint.CreateLocalPos0Attr(Gf.Vec3f(*anchor_T_joint[:3, 3].tolist()))
        joint.CreateLocalRot0Attr(_quatf(anchor_T_joint[:3, :3]))
        joint.CreateLocalPos1Attr(Gf.Vec3f(*body_T_joint[:3, 3].tolist()))
        joint.CreateLocalRot1Attr(_quatf(body_T_joint[:3, :3]))

    def _joint_physics(self, prim: Usd.Prim, joint: int, angular: bool, to_usd: float) -> None:
        model, name = self.model, self.model.joint(joint).name
        dof = model.jnt_dofadr[joint]
        for attribute, value in (("frictionLoss", model.dof_frictionloss[dof]), ("damping", model.dof_damping[dof]),
                                 ("armature", model.dof_armature[dof])):
            prim.CreateAttribute(f"twinloop:{attribute}", Sdf.ValueTypeNames.Double).Set(float(value))
        if name not in COMMAND_JOINT_TO_ACTUATOR:
            return
        actuator = model.actuator(COMMAND_JOINT_TO_ACTUATOR[name]).id
        drive = UsdPhysics.DriveAPI.Apply(prim, "angular" if angular else "linear")
        # USD drive gains are per degree for angular drives: kp [N*m/rad] -> [N*m/deg].
        drive.CreateStiffnessAttr(float(model.actuator_gainprm[actuator, 0] / to_usd))
        drive.CreateDampingAttr(float(-model.actuator_biasprm[actuator, 2] / to_usd))
        drive.CreateMaxForceAttr(float(model.actuator_forcerange[actuator, 1]) or 1e6)
        drive.CreateTargetPositionAttr(float(self.data.qpos[model.jnt_qposadr[joint]] * to_usd))
        drive.CreateTypeAttr("force")

    # ---------------------------------------------------------------- cameras
    def cameras(self, intrinsics: dict) -> None:
        for camera_id in range(self.model.ncam):
            name = self.model.camera(camera_id).name
            pose = np.eye(4)
            pose[:3, :3] = self.data.cam_xmat[camera_id].reshape(3, 3)
            pose[:3, 3] = self.data.cam_xpos[camera_id]
            body = int(self.model.cam_bodyid[camera_id])
            parent = self.prim_of_body[body]
            # USD cameras look along -Z with +Y up, as MuJoCo's do: no axis change needed.
            camera = UsdGeom.Camera.Define(self.stage, f"{parent}/{name}")
            camera.AddTransformOp().Set(Gf.Matrix4d((np.linalg.inv(self._world_pose(body)) @ pose).T.tolist()))
            k = intrinsics[name]
            camera.CreateFocalLengthAttr(float(k.fx * PIXEL_PITCH_MM))
            camera.CreateHorizontalApertureAttr(float(k.width * PIXEL_PITCH_MM))
            camera.CreateVerticalApertureAttr(float(k.height * PIXEL_PITCH_MM))
            camera.CreateHorizontalApertureOffsetAttr(float((k.cx - (k.width - 1) / 2.0) * PIXEL_PITCH_MM))
            camera.CreateVerticalApertureOffsetAttr(float(((k.height - 1) / 2.0 - k.cy) * PIXEL_PITCH_MM))
            camera.CreateClippingRangeAttr(Gf.Vec2f(float(k.depth_min_m), float(k.depth_max_m)))
            prim = camera.GetPrim()
            prim.CreateAttribute("twinloop:width", Sdf.ValueTypeNames.Int).Set(int(k.width))
            prim.CreateAttribute("twinloop:height", Sdf.ValueTypeNames.Int).Set(int(k.height))
            prim.CreateAttribute("twinloop:rate_hz", Sdf.ValueTypeNames.Double).Set(float(k.rate_hz))
            prim.CreateAttribute("twinloop:opticalFrame", Sdf.ValueTypeNames.String).Set(k.color_optical_frame)


def _name(model: mujoco.MjModel, body: int) -> str:
    return model.body(body).name or f"body_{body}"


def _rotation_x_to(axis: np.ndarray) -> np.ndarray:
    """A rotation whose X column is `axis` (unit)."""
    x = np.asarray(axis, dtype=float) / np.linalg.norm(axis)
    helper = np.array([0.0, 0.0, 1.0]) if abs(x[2]) < 0.9 else np.array([0.0, 1.0, 0.0])
    y = np.cross(helper, x)
    y /= np.linalg.norm(y)
    return np.stack([x, y, np.cross(x, y)], axis=1)


def _quatf(rotation: np.ndarray) -> Gf.Quatf:
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.ascontiguousarray(rotation).reshape(-1))
    return Gf.Quatf(*quat.tolist())
