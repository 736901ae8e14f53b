"""Build the MuJoCo scene of the workcell from its description and a physics hypothesis.

The composed URDF (Panda + workcell) goes through MuJoCo's URDF importer, so every body
pose comes from the URDF and nowhere else; MjSpec then adds what a URDF cannot say:
actuators with the command delay, joint friction, gravity compensation, cameras, lights,
the ChArUco texture and the box's physics. Pure Python (no rclpy).

Decisions (why):
- Timestep 1 ms: the Panda's controller runs at 1 kHz, so the command delay resolves to the
  same 1 ms grid as real hardware, /joint_states at >= 500 Hz needs no interpolation, and
  the stiffest servo (kp 2000 N·m/rad on a ~0.1 kg·m² joint, omega*dt < 0.2) stays well
  inside the stable range of the `implicitfast` integrator, which also treats the actuator
  kv and joint damping implicitly.
- Gravity compensation: body `gravcomp = 1` on every robot body with `actuatorgravcomp`
  on its joints, i.e. an exact model-based g(q) added to the actuator force, as a Panda
  joint impedance controller does. It appears in qfrc_actuator (the reported effort) and
  is clamped with the servo torque to the URDF effort limit.
- Command delay: MuJoCo 4 actuator `delay` reads ctrl from a per-actuator history ring
  buffer at time - delay (zero-order hold). The buffer needs nsample * dt >= delay; we
  size it for `max_command_delay_s` so identification can change `model.actuator_delay`
  at run time without rebuilding. Because the buffer is read before it is written, any
  delay in (0, dt] acts as one step; delay 0 reads mjData.ctrl directly. A delay of whole
  steps would read the buffer exactly at a sample's time, where round-off in the absolute
  simulation time picks the sample before or after it (measured: one run acted as 8 or as
  9 ms depending on how long the simulation had run), so the model holds the command delay
  half a step short (`mujoco_actuator_delay`): it then acts as exactly the whole-step delay
  at any time. `command.delay_s` in a twin is a command delay, never the MuJoCo field; it
  acts as the whole step at or above it (`acting_command_delay`). Identification, which sees
  only the step that acts, reports the middle of that step: a delay in (k - 1, k] steps
  acts as k.
"""

from __future__ import annotations

import hashlib
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Sequence

import mujoco
import numpy as np

from twinloop_twin.geometry_layer import GeometryLayer, apply_to_spec, with_measured_box
from twinloop_twin.physics import (ARM_JOINTS, COMMANDED_JOINTS, FINGER_JOINTS, CameraOffset, PhysicsConfigError,
                                   WorkcellPhysics, load_physics)
from twinloop_twin.workcell import CharucoBoardSpec, WorkcellDescription, urdf_for_mujoco

TIMESTEP_S = 0.001


def mujoco_actuator_delay(delay_s: float, timestep_s: float = TIMESTEP_S) -> float:
    """MuJoCo's zero-order-hold actuator `delay` for a command delay `delay_s` (see above):
    `delay_s` rounded up to whole steps, less half a step; 0 stays 0."""
    if delay_s <= 0.0:
        return 0.0
    return (max(1, math.ceil(delay_s / timestep_s - 1e-6)) - 0.5) * timestep_s


def command_delay_of(mujoco_delay_s: float, timestep_s: float = TIMESTEP_S) -> float:
    """The command delay a zero-order-hold actuator `delay` acts as (whole steps)."""
    if mujoco_delay_s <= 0.0:
        return 0.0
    return max(1, math.ceil(mujoco_delay_s / timestep_s - 1e-6)) * timestep_s


def acting_command_delay(delay_s: float, timestep_s: float = TIMESTEP_S) -> float:
    """The whole-step delay a twin's `command.delay_s` acts as in its scene (rounded up; 0
    stays 0)."""
    return command_delay_of(mujoco_actuator_delay(delay_s, timestep_s), timestep_s)
MAX_COMMAND_DELAY_S = 0.1  # history buffer length; identification may set delays up to this
ROBOT_ROOT_BODY = "panda_link0"
GRIPPER_ACTUATOR = "panda_gripper"  # drives panda_finger_joint1; finger 2 follows by equality
# The cell around the robot (links of urdf/workcell.urdf): what RViz draws as the twin's scene.
SCENE_BODIES = ("table", "charuco_board", "static_camera_stand", "box")
CACHE_ENV = "TWINLOOP_CACHE"

# MuJoCo cameras look along -z with +y up; REP-103 optical frames look along +z with +y
# down: a half turn about x maps one onto the other.
OPTICAL_T_MUJOCO_CAMERA_QUAT = (0.0, 1.0, 0.0, 0.0)

_COLLISION_GROUP = 3  # hidden by default in renders; visual geoms (group 1) are drawn
_PANDA_WHITE = (0.92, 0.92, 0.92, 1.0)


def build_workcell_spec(workcell: WorkcellDescription, physics: WorkcellPhysics, *,
                        max_command_delay_s: float = MAX_COMMAND_DELAY_S,
                        geometry: GeometryLayer | None = None) -> mujoco.MjSpec:
    """The workcell's MuJoCo scene; with a measured `geometry` layer on top (table height,
    the box's start pose, scanned objects) when the twin has one."""
    if geometry is not None:
        workcell = with_measured_box(workcell, geometry)
    spec = _import_urdf(workcell.urdf_xml)
    spec.modelname = "twinloop_workcell"
    _set_options(spec)
    _style_geoms(spec)
    _compensate_gravity(spec)
    _add_payload(spec, physics)
    _set_joint_physics(spec, physics)
    _add_actuators(spec, physics, max_command_delay_s)
    _set_box(spec, workcell, physics)
    _set_finger_friction(spec, physics)
    _add_cameras(spec, workcell, physics)
    _add_environment(spec)
    _add_charuco_texture(spec, workcell.board)
    _add_home_keyframe(spec, workcell)
    if geometry is not None:
        apply_to_spec(spec, geometry)
    return spec


def compile_workcell(workcell: WorkcellDescription, physics: WorkcellPhysics, **kwargs) -> mujoco.MjModel:
    return build_workcell_spec(workcell, physics, **kwargs).compile()


# ---------------------------------------------------------------------------------------
# Name mapping helpers for the simulator
# ---------------------------------------------------------------------------------------

def actuator_name_for_joint(joint: str) -> str:
    """Command joint -> actuator name: arm actuators share the joint's name; the gripper has one."""
    if joint in ARM_JOINTS:
        return joint
    if joint == FINGER_JOINTS[0]:
        return GRIPPER_ACTUATOR
    raise KeyError(f"joint '{joint}' is not commandable; commandable joints are {list(COMMANDED_JOINTS)}")


COMMAND_JOINT_TO_ACTUATOR: dict[str, str] = {joint: actuator_name_for_joint(joint) for joint in COMMANDED_JOINTS}


def _ids(model: mujoco.MjModel, kind: mujoco.mjtObj, names: Iterable[str]) -> np.ndarray:
    ids = []
    for name in names:
        index = mujoco.mj_name2id(model, kind, name)
        if index < 0:
            raise KeyError(f"no {kind.name.removeprefix('mjOBJ_').lower()} named '{name}' in the model")
        ids.append(index)
    return np.asarray(ids, dtype=int)


def delayed_target(model: mujoco.MjModel, data: mujoco.MjData, actuator: int) -> float:
    """The target an actuator acts on now: its delayed command where it has a delay
    (mj_readCtrl at the current time applies the actuator's delay itself)."""
    if model.actuator_delay[actuator] <= 0.0 or model.actuator_history[actuator, 0] <= 0:
        return float(data.ctrl[actuator])
    result = np.zeros(1)
    value = mujoco.mj_readCtrl(model, data, actuator, data.time, result, 0)
    return float(result[0] if value is None else np.asarray(value).ravel()[0])


def joint_qpos_addresses(model: mujoco.MjModel, names: Sequence[str]) -> np.ndarray:
    return model.jnt_qposadr[_ids(model, mujoco.mjtObj.mjOBJ_JOINT, names)]


def joint_dof_addresses(model: mujoco.MjModel, names: Sequence[str]) -> np.ndarray:
    return model.jnt_dofadr[_ids(model, mujoco.mjtObj.mjOBJ_JOINT, names)]


def actuator_ids(model: mujoco.MjModel, names: Sequence[str]) -> np.ndarray:
    return _ids(model, mujoco.mjtObj.mjOBJ_ACTUATOR, names)


def command_actuator_ids(model: mujoco.MjModel, joints: Sequence[str]) -> np.ndarray:
    """Actuator ids for command joint names (the /joint_command names)."""
    return actuator_ids(model, [actuator_name_for_joint(joint) for joint in joints])


def reset_to_home(model: mujoco.MjModel, data: mujoco.MjData) -> None:
    """Home pose, targets at home, box at its nominal pose, delay buffers filled with home."""
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    fill_command_history(model, data)
    mujoco.mj_forward(model, data)


def fill_command_history(model: mujoco.MjModel, data: mujoco.MjData) -> None:
    """Make the delayed-command buffers hold the current ctrl (they start at zero).

    Without this a delayed actuator would chase target 0 for the first `delay` seconds.
    """
    for actuator in range(model.nu):
        if model.actuator_history[actuator, 0] > 0:
            mujoco.mj_initCtrlHistory(model, data, actuator, None, np.full(model.actuator_history[actuator, 0],
                                                                          data.ctrl[actuator]))


# ---------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------

def _import_urdf(urdf_xml: str) -> mujoco.MjSpec:
    root = ET.fromstring(urdf_for_mujoco(urdf_xml))
    # keep the optical-frame and hand bodies (fusestatic) and visual geoms (discardvisual)
    extension = ET.SubElement(root, "mujoco")
    ET.SubElement(extension, "compiler", strippath="false", discardvisual="false", fusestatic="false")
    return mujoco.MjSpec.from_string(ET.tostring(root, encoding="unicode"))


def _set_options(spec: mujoco.MjSpec) -> None:
    spec.option.timestep = TIMESTEP_S
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC  # isotropic friction for sliding the box
    spec.visual.quality.shadowsize = 0  # no shadow maps: shadows cost ~6x render time
    spec.visual.headlight.ambient = [0.3, 0.3, 0.3]
    spec.visual.headlight.diffuse = [0.4, 0.4, 0.4]
    spec.visual.map.znear = 0.005  # x model extent; the wrist camera sees the fingers up close


def _robot_bodies(spec: mujoco.MjSpec) -> list[mujoco.MjsBody]:
    root = spec.body(ROBOT_ROOT_BODY)
    return [root, *root.find_all(mujoco.mjtObj.mjOBJ_BODY)]


def _style_geoms(spec: mujoco.MjSpec) -> None:
    robot = {body.name for body in _robot_bodies(spec)}
    for geom in spec.geoms:
        if geom.contype or geom.conaffinity:
            geom.group = _COLLISION_GROUP  # URDF <collision>: simulated, not drawn
        elif geom.parent.name in robot and geom.type == mujoco.mjtGeom.mjGEOM_MESH:
            geom.rgba = _PANDA_WHITE


def _compensate_gravity(spec: mujoco.MjSpec) -> None:
    for body in _robot_bodies(spec):
        body.gravcomp = 1.0
        for joint in body.joints:
            joint.actgravcomp = True


PAYLOAD_BODY = "unmodelled_payload"
PAYLOAD_PARENT = "panda_hand"
PAYLOAD_RADIUS_M = 0.03  # its inertia: a solid sphere of this radius (it has no geom: nothing collides)


def _add_payload(spec: mujoco.MjSpec, physics: WorkcellPhysics) -> None:
    """A truth file's payload: a mass on the hand outside the robot's gravity compensation,
    as on a real arm whose description lacks it."""
    payload = physics.unmodelled.payload if physics.unmodelled is not None else None
    if payload is None:
        return
    add_hand_load(spec, payload.mass_kg, payload.offset_m)


def add_hand_load(spec: mujoco.MjSpec, mass_kg: float, offset_m, radius_m: float = PAYLOAD_RADIUS_M) -> None:
    """A load on the hand: a solid sphere of `radius_m` (0: a point) at `offset_m` in the
    hand's frame, outside the robot's gravity compensation, colliding with nothing."""
    inertia = max(0.4 * mass_kg * radius_m ** 2, 1e-9)
    body = spec.body(PAYLOAD_PARENT).add_body(name=PAYLOAD_BODY, pos=list(offset_m))
    body.mass = mass_kg
    body.ipos = [0.0, 0.0, 0.0]  # its mass at the body's origin (add_body(pos=) also set the inertial frame there:
    #                              the mass sat at twice the offset)
    body.iquat = [1.0, 0.0, 0.0, 0.0]
    body.inertia = [inertia, inertia, inertia]
    body.explicitinertial = True
    body.gravcomp = 0.0


def _set_joint_physics(spec: mujoco.MjSpec, physics: WorkcellPhysics) -> None:
    for name, joint_physics in physics.joints.items():
        joint = spec.joint(name)
        joint.frictionloss = joint_physics.friction_loss
        joint.damping = [joint_physics.damping, 0.0, 0.0] if _is_vector(joint.damping) else joint_physics.damping
        joint.armature = joint_physics.armature


def _is_vector(value) -> bool:
    return np.ndim(value) > 0


def _add_actuators(spec: mujoco.MjSpec, physics: WorkcellPhysics, max_command_delay_s: float) -> None:
    delay_s = physics.command_delay_s
    nsample = math.ceil(max(delay_s, max_command_delay_s) / TIMESTEP_S - 1e-9)
    for joint_name in COMMANDED_JOINTS:
        gains = physics.joints[joint_name]
        joint = spec.joint(joint_name)
        actuator = spec.add_actuator(name=actuator_name_for_joint(joint_name), target=joint_name,
                                     trntype=mujoco.mjtTrn.mjTRN_JOINT)
        actuator.set_to_position(kp=gains.kp, kv=gains.kv)
        actuator.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        actuator.ctrlrange = joint.range
        actuator.delay = mujoco_actuator_delay(delay_s)
        actuator.nsample = nsample
        actuator.interp = 0  # zero-order hold: a real command is held until the next one


def _set_box(spec: mujoco.MjSpec, workcell: WorkcellDescription, physics: WorkcellPhysics) -> None:
    body = spec.body(workcell.box.link)
    body.pos = workcell.box.world_position_m  # the free joint's initial pose is the body pose
    body.quat = workcell.box.world_quat_wxyz
    mass = physics.box.mass_kg
    sx, sy, sz = workcell.box.size_m
    body.mass = mass
    body.ipos = [0.0, 0.0, 0.0]
    body.iquat = [1.0, 0.0, 0.0, 0.0]
    body.inertia = [mass * (sy**2 + sz**2) / 12, mass * (sx**2 + sz**2) / 12, mass * (sx**2 + sy**2) / 12]
    body.fullinertia = [math.nan] * 6  # the URDF importer set a full tensor; NaN = unset
    for geom in body.geoms:
        if geom.contype or geom.conaffinity:
            # priority: the box's coefficient alone decides box-table friction (no max-combining)
            geom.priority = 1
            geom.friction = [physics.box.friction, 0.005, 0.0001]


def _set_finger_friction(spec: mujoco.MjSpec, physics: WorkcellPhysics) -> None:
    for finger in ("panda_leftfinger", "panda_rightfinger"):
        for geom in spec.body(finger).geoms:
            if geom.contype or geom.conaffinity:
                geom.priority = 2  # finger pads decide finger-object friction
                geom.friction = [physics.finger_friction, 0.005, 0.0001]


def camera_offset_transform(offset: CameraOffset) -> np.ndarray:
    """The 4x4 transform from a camera's described optical frame to where it is (URDF rpy:
    R = Rz(yaw) Ry(pitch) Rx(roll))."""
    from scipy.spatial.transform import Rotation

    transform = np.eye(4)
    transform[:3, :3] = Rotation.from_euler("xyz", offset.rpy_deg, degrees=True).as_matrix()  # fixed axes
    transform[:3, 3] = offset.xyz_m
    return transform


def camera_offsets(physics: WorkcellPhysics | None) -> dict[str, CameraOffset]:
    """The truth file's cameras off their described mounts, by camera name (none: {})."""
    if physics is None or physics.unmodelled is None:
        return {}
    return {offset.camera: offset for offset in physics.unmodelled.camera_offsets}


def check_camera_offsets(physics: WorkcellPhysics, workcell: WorkcellDescription) -> dict[str, CameraOffset]:
    """The truth's camera offsets, each naming a camera of the workcell (else PhysicsConfigError)."""
    offsets = camera_offsets(physics)
    unknown = sorted(set(offsets) - set(workcell.cameras))
    if unknown:
        raise PhysicsConfigError(f"{physics.source}: key 'unmodelled.camera_offsets' names {', '.join(unknown)}, "
                                 f"not a camera of the workcell; name one of {sorted(workcell.cameras)}")
    return offsets


def load_truth(path: Path | str, workcell: WorkcellDescription) -> WorkcellPhysics:
    """A physics file for a simulated cell of `workcell`: every key checked, its camera
    offsets naming the workcell's cameras (PhysicsConfigError naming the file and key)."""
    physics = load_physics(path)
    check_camera_offsets(physics, workcell)
    return physics


def _add_cameras(spec: mujoco.MjSpec, workcell: WorkcellDescription, physics: WorkcellPhysics) -> None:
    offsets = check_camera_offsets(physics, workcell)
    for name, intrinsics in workcell.cameras.items():
        camera = spec.body(intrinsics.color_optical_frame).add_camera(name=name)
        camera.quat = OPTICAL_T_MUJOCO_CAMERA_QUAT
        if name in offsets:  # a truth's camera off its mount: the optical frame moved, then MuJoCo's half turn
            moved = camera_offset_transform(offsets[name])
            quat = np.zeros(4)
            mujoco.mju_mat2Quat(quat, moved[:3, :3].ravel())
            mujoco.mju_mulQuat(quat, quat.copy(), np.array(OPTICAL_T_MUJOCO_CAMERA_QUAT, dtype=float))
            camera.pos, camera.quat = moved[:3, 3], quat
        camera.resolution = [intrinsics.width, intrinsics.height]
        # exact pinhole intrinsics; the sensor size only sets the pixel pitch (1 unit per px)
        camera.sensor_size = [float(intrinsics.width), float(intrinsics.height)]
        camera.focal_pixel = [intrinsics.fx, intrinsics.fy]
        # Measured in MuJoCo 4: a +20 px principal offset moves the image content 20 px left/up,
        # and a zero offset puts the axis on the image centre, which is pixel (W-1)/2 in
        # OpenCV's pixel-centre convention. Hence cx = (W-1)/2 - offset_x (same for y);
        # test_rendered_charuco_board_is_detected_at_its_urdf_pose pins this.
        camera.principal_pixel = [(intrinsics.width - 1) / 2.0 - intrinsics.cx,
                                  (intrinsics.height - 1) / 2.0 - intrinsics.cy]
        camera.fovy = intrinsics.fovy_deg  # ignored when sensor_size is set; kept for tools that read it


def _add_environment(spec: mujoco.MjSpec) -> None:
    world = spec.worldbody
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[3.0, 3.0, 0.05],
                   rgba=[0.55, 0.57, 0.6, 1.0])
    # ceiling lights of the cell; no shadows (they cost ~6x render time)
    for index, position in enumerate(([0.4, -0.8, 2.5], [0.4, 0.8, 2.5])):
        light = world.add_light(name=f"ceiling_light_{index}", pos=position)
        light.dir = np.array([0.4, 0.0, 0.75]) - np.array(position)
        light.diffuse = [0.45, 0.45, 0.45]
        light.specular = [0.1, 0.1, 0.1]
        light.castshadow = False


def _add_home_keyframe(spec: mujoco.MjSpec, workcell: WorkcellDescription) -> None:
    """Keyframe `home`: joints at home, box at its nominal pose, targets at home."""
    qpos: list[float] = []
    # qpos follows the spec's depth-first joint order, exactly as the compiler lays it out
    for joint in spec.joints:
        if joint.type == mujoco.mjtJoint.mjJNT_FREE:
            qpos += [*workcell.box.world_position_m, *workcell.box.world_quat_wxyz]
        else:
            qpos.append(workcell.home_joint_positions[joint.name])
    ctrl = [workcell.home_joint_positions[joint] for joint in COMMANDED_JOINTS]
    spec.add_key(name="home", qpos=qpos, ctrl=ctrl)


# ---------------------------------------------------------------------------------------
# ChArUco board texture
# ---------------------------------------------------------------------------------------

TEXTURE_PIXELS_PER_M = 4000  # 0.25 mm per texel: sharp marker edges at wrist-camera range


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "twinloop"


def charuco_texture_path(board: CharucoBoardSpec) -> Path:
    """Render the board pattern once with cv2.aruco into the cache; return the PNG path."""
    import cv2  # only needed for the texture; keep `import twinloop_twin.scene` light

    key = f"{board.squares_x}x{board.squares_y}_{board.square_length_m}_{board.marker_length_m}_{board.dictionary}"
    digest = hashlib.sha1(f"{key}_{TEXTURE_PIXELS_PER_M}_{cv2.__version__}".encode()).hexdigest()[:12]
    path = cache_dir() / f"charuco_{digest}.png"
    if path.is_file():
        return path
    width_m, height_m = board.size_m
    size_px = (round(width_m * TEXTURE_PIXELS_PER_M), round(height_m * TEXTURE_PIXELS_PER_M))
    image = make_charuco_board(board).generateImage(size_px, marginSize=0, borderBits=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.png")
    cv2.imwrite(str(temporary), image)
    temporary.replace(path)  # atomic: concurrent builders never read a half-written file
    return path


def make_charuco_board(board: CharucoBoardSpec):
    """The cv2.aruco.CharucoBoard of the workcell (for rendering and for detection)."""
    import cv2

    dictionary_id = getattr(cv2.aruco, board.dictionary, None)
    if dictionary_id is None:
        raise ValueError(f"unknown aruco dictionary '{board.dictionary}'; use a cv2.aruco DICT_* name")
    dictionary = cv2.aruco.getPredefinedDictionary(dictionary_id)
    return cv2.aruco.CharucoBoard((board.squares_x, board.squares_y), board.square_length_m,
                                  board.marker_length_m, dictionary)


def _add_charuco_texture(spec: mujoco.MjSpec, board: CharucoBoardSpec) -> None:
    """A textured quad on the board's top face (z = 0 of the board frame, facing -z).

    A mesh with explicit texture coordinates pins texel (u, v) to board (x, y) exactly, so
    the printed pattern sits where OpenCV's board frame says it does.
    """
    width_m, height_m = board.size_m
    spec.add_texture(name="charuco", type=mujoco.mjtTexture.mjTEXTURE_2D,
                     file=str(charuco_texture_path(board)))
    material = spec.add_material(name="charuco", rgba=[1, 1, 1, 1], specular=0.0, shininess=0.0)
    material.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "charuco"
    lift = -0.0002  # 0.2 mm above the board body (board z points into the board) to avoid z-fighting
    vertices = [0, 0, lift, width_m, 0, lift, width_m, height_m, lift, 0, height_m, lift]
    # texel (u, v) = (x / width, y / height): MuJoCo's v = 0 is the image's first row, which
    # cv2 draws at the board's y = 0 edge (checked by detecting the rendered board)
    texcoords = [0, 0, 1, 0, 1, 1, 0, 1]
    faces = [0, 2, 1, 0, 3, 2]  # wound so the normal is -z (out of the board, up)
    spec.add_mesh(name="charuco_quad", uservert=vertices, userface=faces, usertexcoord=texcoords,
                  inertia=mujoco.mjtMeshInertia.mjMESH_INERTIA_SHELL)
    spec.body(board.frame).add_geom(name="charuco_pattern", type=mujoco.mjtGeom.mjGEOM_MESH,
                                     meshname="charuco_quad", material="charuco", contype=0,
                                     conaffinity=0, group=1, mass=0.0)
