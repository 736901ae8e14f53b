"""Identification sessions recorded in-process from a known physics file (no DDS).

The emulated workcell's own simulation class (twinloop_sim.workcell_sim.WorkcellSimulation)
runs a truth file with its sensor noise, stepped in 2 ms chunks with commands applied at
chunk starts, exactly as the emulated workcell node steps it; joint states are sampled
every chunk (500 Hz) and the box pose every 20 ms (the node's /tf rate). What is missing
compared with a bag of the node: DDS delivery jitter of the commands. Pure Python.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np

from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.geometry_layer import GeometryLayer, ScannedObject
from twinloop_twin.physics import COMMANDED_JOINTS, WorkcellPhysics
from twinloop_twin.scene import compile_workcell
from twinloop_twin.workcell import WorkcellDescription

from twinloop_builder.excitation import JointTrajectory
from twinloop_builder.recording import RecordedMotion

# A segment is a trajectory, or a function of the box position planning one (a push).
Segment = Union[JointTrajectory, Callable[[np.ndarray], JointTrajectory]]


def simulate_session(workcell: WorkcellDescription, physics: WorkcellPhysics, segments: Sequence[Segment], *,
                     name: str = "synthetic", split: str = "fit", seed: int = 0, settle_s: float = 0.3,
                     chunk_s: float = 0.002, box_period_s: float = 0.02,
                     command_jitter_s: float = 0.0,
                     on_chunk: Callable[[WorkcellSimulation], None] | None = None) -> RecordedMotion:
    """Play the segments one after another on the truth physics and record what a bag would hold.

    `command_jitter_s` > 0 delays each command's application by a random fraction of a
    chunk after its recorded time, as DDS delivery to the workcell does. `on_chunk(sim)` is
    called after every chunk (e.g. to render the cameras at that instant's state).
    """
    sim = WorkcellSimulation(workcell, physics, seed=seed)
    rng = np.random.default_rng(seed + 1)
    steps = int(round(chunk_s / sim.timestep_s))
    box_every = max(1, int(round(box_period_s / chunk_s)))
    state_t, position, velocity, effort, command_t, command, box_t, box_pose = [], [], [], [], [], [], [], []
    targets = sim.targets()

    def sample() -> None:
        state = sim.joint_state()
        state_t.append(sim.time_s)
        position.append(state.position)
        velocity.append(state.velocity)
        effort.append(state.effort)
        if (len(state_t) - 1) % box_every == 0:
            box_t.append(sim.time_s)
            box_pose.append(sim.box_qpos())
        if on_chunk is not None:
            on_chunk(sim)

    def run_until(end_s: float, due: list[tuple[float, float, np.ndarray]]) -> None:
        while sim.time_s < end_s - 1e-9:
            now = sim.time_s
            while due and due[0][1] <= now + 1e-9:
                _, _, values = due.pop(0)
                sim.command(COMMANDED_JOINTS, values)
            sim.step_until(now + steps * sim.timestep_s)
            sample()

    sample()
    run_until(settle_s, [])
    for segment in segments:
        trajectory = segment if isinstance(segment, JointTrajectory) else segment(sim.box_qpos()[:3])
        start = sim.time_s
        due = []
        for t, row in zip(trajectory.t, trajectory.positions):
            log_t = start + t
            apply_t = log_t + (rng.uniform(0.0, command_jitter_s) if command_jitter_s > 0 else 0.0)
            due.append((log_t, apply_t, row))
            targets = dict(zip(COMMANDED_JOINTS, row))
            command_t.append(log_t)
            command.append([targets[j] for j in COMMANDED_JOINTS])
        if command_jitter_s > 0:
            # applied at the first chunk start at or after delivery
            due = [(lt, chunk_s * np.ceil(at / chunk_s - 1e-9), row) for lt, at, row in due]
        run_until(start + trajectory.duration_s + settle_s, due)
    return RecordedMotion(name, np.array(state_t), np.array(position), np.array(velocity), np.array(effort),
                     np.array(command_t), np.array(command), np.array(box_t), np.array(box_pose), split,
                     "identification", f"synthetic:{name}", "", box_source="ground_truth")


def write_bag(recording: RecordedMotion, path, *, split: str | None = None, purpose: str = "identification",
              joint_names: Sequence[str] | None = None, skip_topics: Sequence[str] = (),
              box_topic: str = "/twinloop/emulated_workcell/box_pose", start_ns: int = 1_800_000_000_000_000_000,
              applied_topic: str | None = None, command_log_delay_s: float = 0.0):
    """Write a recording as a rosbag2 MCAP bag with twinloop session metadata (as the recorder
    would), e.g. to test the bag path of identification without DDS. `joint_names` renames
    the joints (to test a bag of another robot); `skip_topics` leaves topics out.
    `applied_topic` adds the commands as a simulated workcell reports them (stamped when they
    took effect); `command_log_delay_s` logs /joint_command that much late, as a recorder
    receiving them after the workcell does. With `box_topic` the box tracker's
    (TRACKED_BOX_POSE_TOPIC) the box goes there as the tracker publishes it
    (PoseWithCovarianceStamped); else as a simulator's ground truth (PoseStamped)."""
    from pathlib import Path

    from twinloop_logging.bag_writer import BagWriter
    from twinloop_logging.session import SESSION_KEY, SessionInfo
    from twinloop_logging.typedefs import TypeResolver
    from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC
    from twinloop_twin.physics import ALL_JOINTS

    path = Path(path)
    resolver = TypeResolver()
    store = resolver.typestore
    JointState, Header, Time = (store.types[t] for t in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                         "builtin_interfaces/msg/Time"))
    Pose, PoseStamped, Point, Quaternion, PoseWithCovariance, PoseWithCovarianceStamped = (store.types[t] for t in (
        "geometry_msgs/msg/Pose", "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/Point",
        "geometry_msgs/msg/Quaternion", "geometry_msgs/msg/PoseWithCovariance",
        "geometry_msgs/msg/PoseWithCovarianceStamped"))
    tracked = box_topic == TRACKED_BOX_POSE_TOPIC
    box_kind = "geometry_msgs/msg/PoseWithCovarianceStamped" if tracked else "geometry_msgs/msg/PoseStamped"
    names = list(joint_names or ALL_JOINTS)
    commanded = [names[ALL_JOINTS.index(j)] for j in COMMANDED_JOINTS]

    def header(t: float, frame: str = "") -> tuple:
        ns = start_ns + int(round(t * 1e9))
        return ns, Header(stamp=Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000), frame_id=frame)

    writer = BagWriter(path)
    session = SessionInfo(session_id=path.name, purpose=purpose, split=split or recording.split,
                          profile="identification", robot="synthetic")
    writer.custom_data[SESSION_KEY] = session.to_json()
    topics = {"/joint_states": "sensor_msgs/msg/JointState", "/joint_command": "sensor_msgs/msg/JointState",
              box_topic: box_kind}
    if applied_topic:
        topics[applied_topic] = "sensor_msgs/msg/JointState"
    for topic, kind in topics.items():
        if topic not in skip_topics:
            writer.add_topic(topic, resolver.definition(kind))
    events = []
    if "/joint_states" not in skip_topics:
        for i, t in enumerate(recording.state_t):
            ns, h = header(t)
            msg = JointState(header=h, name=names, position=recording.position[i].copy(),
                             velocity=recording.velocity[i].copy(), effort=recording.effort[i].copy())
            events.append((ns, "/joint_states", store.serialize_cdr(msg, "sensor_msgs/msg/JointState")))
    for topic, late_s in (("/joint_command", command_log_delay_s), (applied_topic, 0.0)):
        if topic and topic not in skip_topics:
            for t, row in zip(recording.command_t, recording.command):
                ns, h = header(t)
                msg = JointState(header=h, name=commanded, position=np.asarray(row, dtype=float),
                                 velocity=np.zeros(0), effort=np.zeros(0))
                events.append((ns + int(round(late_s * 1e9)), topic,
                               store.serialize_cdr(msg, "sensor_msgs/msg/JointState")))
    if box_topic not in skip_topics:
        for t, pose in zip(recording.box_t, recording.box_pose):
            ns, h = header(t, "world")
            x, y, z, qw, qx, qy, qz = (float(v) for v in pose)
            pose = Pose(position=Point(x=x, y=y, z=z), orientation=Quaternion(x=qx, y=qy, z=qz, w=qw))
            msg = (PoseWithCovarianceStamped(header=h, pose=PoseWithCovariance(pose=pose, covariance=np.zeros(36)))
                   if tracked else PoseStamped(header=h, pose=pose))
            events.append((ns, box_topic, store.serialize_cdr(msg, box_kind)))
    events.sort(key=lambda e: e[0])
    try:
        for ns, topic, data in events:
            writer.write(topic, data, ns)
    finally:
        writer.close()
    return path


# An L-shaped bracket that the workcell description lacks: two 5 cm high arms at a right
# angle, (x range, y range) of each in world m, on the table beside the board where three
# or four of the scan's views see it. Its notch (the rectangle the L wraps) is free space
# that one convex hull of the bracket would fill.
BRACKET_ARMS = (((0.50, 0.53), (-0.08, 0.06)), ((0.53, 0.57), (-0.08, -0.05)))
BRACKET_NOTCH = ((0.53, 0.57), (-0.05, 0.06))
BRACKET_HEIGHT_M = 0.05


def bracket_cell(workcell: WorkcellDescription) -> GeometryLayer:
    """The described cell plus the bracket (as `render_scan(extra=)` takes it)."""
    table = workcell.table_top_height_m
    arms = tuple(ScannedObject(f"bracket_arm{k}", ((x0 + x1) / 2, (y0 + y1) / 2, table + BRACKET_HEIGHT_M / 2),
                               (1.0, 0.0, 0.0, 0.0), (x1 - x0, y1 - y0, BRACKET_HEIGHT_M))
                 for k, ((x0, x1), (y0, y1)) in enumerate(BRACKET_ARMS))
    return GeometryLayer(table, tuple(workcell.box.world_position_m), tuple(workcell.box.world_quat_wxyz), arms)


def render_scan(workcell: WorkcellDescription, physics: WorkcellPhysics, *, seed: int = 0,
                depth_noise: bool = True, extra: GeometryLayer | None = None) -> tuple[list, np.ndarray]:
    """The scan views of `twinloop build excite --kind scan` rendered from the wrist camera at
    rest (the physics' sensor noise), each posed by forward kinematics and the URDF mount, as
    `twinloop build geometry` poses a recorded scan; and the box's true pose (x y z qw qx qy qz).
    `extra`: a cell that differs from its description (objects it lacks, another table height)."""
    from twinloop_builder.excitation import scan_view_positions
    from twinloop_builder.geometry.fusion import PosedFrame
    from twinloop_sim.workcell_sim import NO_NOISE, CameraRig
    from twinloop_twin.kinematics import UrdfTransforms

    sim = WorkcellSimulation(workcell, physics, model=None if extra is None else
                             compile_workcell(workcell, physics, geometry=extra))
    kinematics = UrdfTransforms(workcell.urdf_xml)
    camera = workcell.cameras["wrist_camera"]
    rig = CameraRig(sim.model, {"wrist_camera": camera}, physics.noise if depth_noise else NO_NOISE, seed=seed)
    frames = []
    try:
        for index, joints in enumerate(scan_view_positions(workcell.home_joint_positions)):
            qpos = sim.data.qpos.copy()
            for column, name in enumerate(sim.joint_names):
                qpos[sim.qpos_addresses[column]] = joints[name]
            rig.set_state(qpos)
            color, depth = rig.render("wrist_camera")
            frames.append(PosedFrame(color, depth, np.array(camera.camera_matrix),
                                     kinematics.world_T_link(camera.color_optical_frame, joints), name=f"view {index}"))
    finally:
        rig.close()
    return frames, sim.box_qpos().copy()
