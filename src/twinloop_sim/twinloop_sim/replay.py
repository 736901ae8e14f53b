"""Replay a recorded run in a twin: same initial state, same command stream at the recorded
times; compare the twin's response with what the robot did. Pure Python (no rclpy).

The recorded commands are applied when they took effect on the recorded workcell: a
simulated one records that (`/twinloop/<node>/applied_command`, physics clock); for a real
one the recorder's receive time stands in (on the workcell host, when the driver received
them too). The twin is stepped as fast as it computes; its response is sampled at the
physics rate.
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twinloop_logging.bag_reader import Bag, BagError, open_bag
from twinloop_twin.contract import (APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX, CommandRejected, parse_joint_command,
                                   simulated_topic)
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.kinematics import UrdfTransforms

COMMAND_TOPIC = "/joint_command"
STATE_TOPIC = "/joint_states"
END_EFFECTOR = "panda_hand_tcp"
MAX_ALIGNMENT_S = 0.05


class ReplayError(ValueError):
    """The bag cannot be replayed; the message says why and what to record instead."""


@dataclass
class RecordedRun:
    joint_names: list[str]
    state_t: np.ndarray  # (N,) s from the first joint state
    state_q: np.ndarray  # (N, J)
    commands: list[tuple[float, dict[str, float]]]  # (t, targets), in time order
    box_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    box_xyz: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    start_ns: int = 0


@dataclass(frozen=True)
class ReplayResult:
    joint_names: list[str]
    joint_rmse_rad: np.ndarray
    end_effector_rmse_m: float
    box_final_position_error_m: float  # NaN when the bag has no box pose
    time_offset_s: float  # shift that best aligns replayed with recorded motion
    twin_t: np.ndarray
    twin_q: np.ndarray
    twin_box_xyz: np.ndarray


def load_recorded_run(bag_path: Path | str, commandable: list[str], *, bag: Bag | None = None) -> RecordedRun:
    """The run the bag at `bag_path` recorded, for replay; `bag`: that bag already open (read
    here, not closed: each opening parses its metadata again, a few hundred ms)."""
    try:
        with contextlib.nullcontext(bag) if bag is not None else open_bag(bag_path) as bag:
            if COMMAND_TOPIC not in bag.topics or bag.topics[COMMAND_TOPIC].count == 0:
                raise ReplayError(f"bag {bag_path} has no {COMMAND_TOPIC} messages, so there is nothing to "
                                  "replay: record runs with the 'trial' or 'identification' profile")
            states = bag.joint_states(STATE_TOPIC)
            if len(states.stamps_ns) < 2:
                raise ReplayError(f"bag {bag_path} has {len(states.stamps_ns)} {STATE_TOPIC} messages, so there is "
                                  "no recorded motion to compare the twin with: record the run with the robot's "
                                  "joint states ('trial' or 'identification' profile)")
            start_ns = int(states.stamps_ns[0])
            # A simulated workcell records when each command took effect (physics clock);
            # otherwise the recorder's receive time stands in for the driver's.
            counts = {t: info.count for t, info in bag.topics.items()}
            applied = simulated_topic(counts, APPLIED_COMMAND_SUFFIX)
            commands = []
            for message in bag.messages([applied or COMMAND_TOPIC]):
                try:
                    targets = parse_joint_command(message.msg.name, message.msg.position, commandable)
                except CommandRejected as error:
                    raise ReplayError(f"bag {bag_path}: a recorded command does not fit this twin: {error}") from error
                when_ns = _stamp_ns(message.msg) if applied else message.log_time_ns
                commands.append(((when_ns - start_ns) * 1e-9, targets))
            box_topic = simulated_topic(counts, BOX_POSE_SUFFIX)
            box_t, box_xyz = np.zeros(0), np.zeros((0, 3))
            if box_topic:
                poses = list(bag.messages([box_topic]))
                box_t = np.array([(_stamp_ns(m.msg) - start_ns) * 1e-9 for m in poses])
                box_xyz = np.array([[m.msg.pose.position.x, m.msg.pose.position.y, m.msg.pose.position.z] for m in poses])
    except BagError as error:
        raise ReplayError(str(error)) from error
    missing = [j for j in commandable if j not in states.names]
    if missing:
        raise ReplayError(f"bag {bag_path}: {STATE_TOPIC} lacks joints {missing} of this twin "
                          f"(recorded joints: {states.names}); was it recorded on another robot?")
    used = [states.names.index(j) for j in commandable]
    gaps = ~np.isfinite(states.position[:, used]).all(axis=1)
    if gaps.any():
        raise ReplayError(f"bag {bag_path}: {int(gaps.sum())} of {len(gaps)} {STATE_TOPIC} messages lack a finite "
                          f"position of a joint of this twin (first at {states.stamps_ns[gaps.argmax()]} ns); "
                          "the recording cannot be compared there")
    return RecordedRun(list(states.names), (states.stamps_ns - start_ns) * 1e-9, states.position,
                       sorted(commands, key=lambda c: c[0]), box_t, box_xyz, start_ns)


def replay(run: RecordedRun, sim: WorkcellSimulation, kinematics: UrdfTransforms, *,
           period_s: float = 0.002) -> ReplayResult:
    twin_t, twin_q, twin_box = simulate(run, sim, period_s=period_s)
    return _compare(run, sim, kinematics, twin_t, twin_q, twin_box)


def simulate(run: RecordedRun, sim: WorkcellSimulation, *,
             period_s: float = 0.002) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run's commands replayed in `sim` from its first recorded state: (twin_t, twin_q
    of sim.joint_names, twin_box xyz), one row per `period_s`; `replay` without its
    comparison with the recording."""
    initial = {name: float(q) for name, q in zip(run.joint_names, run.state_q[0]) if name in sim.joint_names}
    sim.reset(initial, reset_box=True)
    if len(run.box_t):
        sim.set_box_position(run.box_xyz[0])
    end_s = float(run.state_t[-1])
    samples = int(end_s / period_s) + 1
    steps_per_sample = max(1, int(round(period_s / sim.timestep_s)))
    twin_t = np.arange(samples) * steps_per_sample * sim.timestep_s
    qpos_log = np.empty((samples, sim.model.nq))
    # validated once when loaded; here only resolved to actuator ids (the loop is hot)
    commands = [(t, *sim.actuator_targets(targets)) for t, targets in run.commands]
    next_command = 0
    data = sim.data
    qpos_log[0] = data.qpos
    for k in range(1, samples):
        # commands due in the coming period take effect at its start, as in the servers
        while next_command < len(commands) and commands[next_command][0] <= twin_t[k - 1]:
            _, ids, values = commands[next_command]
            data.ctrl[ids] = values
            next_command += 1
        sim.advance(steps_per_sample)
        qpos_log[k] = data.qpos
    return twin_t, qpos_log[:, sim.qpos_addresses], qpos_log[:, sim.box_qpos_slice][:, :3]


def _compare(run: RecordedRun, sim: WorkcellSimulation, kinematics: UrdfTransforms, twin_t: np.ndarray,
             twin_q: np.ndarray, twin_box: np.ndarray) -> ReplayResult:
    columns = [run.joint_names.index(n) for n in sim.joint_names]
    recorded = run.state_q[:, columns]
    predicted = np.stack([np.interp(run.state_t, twin_t, twin_q[:, j]) for j in range(twin_q.shape[1])], axis=1)
    rmse = np.sqrt(np.mean((predicted - recorded) ** 2, axis=0))
    every = max(1, len(run.state_t) // 500)  # FK on a subsample: ~500 poses are plenty for an RMSE
    ee_errors = [np.linalg.norm(
        kinematics.world_T_link(END_EFFECTOR, dict(zip(sim.joint_names, predicted[i])))[:3, 3]
        - kinematics.world_T_link(END_EFFECTOR, dict(zip(sim.joint_names, recorded[i])))[:3, 3])
        for i in range(0, len(run.state_t), every)]
    box_error = float(np.linalg.norm(twin_box[-1] - run.box_xyz[-1])) if len(run.box_t) else float("nan")
    return ReplayResult(list(sim.joint_names), rmse, float(np.sqrt(np.mean(np.square(ee_errors)))), box_error,
                        _alignment_s(run.state_t, recorded, twin_t, twin_q), twin_t, twin_q, twin_box)


def _alignment_s(state_t, recorded, twin_t, twin_q, resolution_s: float = 0.001) -> float:
    """Shift of the replayed motion (positive: the twin lags) that minimises the error.

    Coarse (5 ms) then fine (1 ms) grid: the cost is smooth in the shift over +-50 ms.
    """
    def cost(shift: float) -> float:
        shifted = np.stack([np.interp(state_t + shift, twin_t, twin_q[:, j]) for j in range(twin_q.shape[1])], axis=1)
        return float(np.mean((shifted - recorded) ** 2))

    coarse = np.arange(-MAX_ALIGNMENT_S, MAX_ALIGNMENT_S + 1e-9, 5 * resolution_s)
    centre = min(coarse, key=cost)
    fine = np.arange(centre - 5 * resolution_s, centre + 5 * resolution_s + 1e-9, resolution_s)
    return float(np.round(min(fine, key=cost), 6))


def _stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


SIM_PREFIX = "/twinloop/sim"


def write_replay_bag(output: Path, run: RecordedRun, result: ReplayResult, *, every: int = 1) -> Path:
    """The twin's response as a rosbag2 MCAP bag: the recorded topics under /twinloop/sim/.
    An existing `output` is never overwritten (ReplayError); a write that fails removes the
    part it wrote, so no half-written bag is left."""
    from twinloop_logging.bag_writer import BagWriter
    from twinloop_logging.session import BagExistsError
    from twinloop_logging.typedefs import TypeResolver

    resolver = TypeResolver()
    store = resolver.typestore
    JointState, Header, Time = (store.types[t] for t in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                         "builtin_interfaces/msg/Time"))
    Pose, PoseStamped, Point, Quaternion = (store.types[t] for t in (
        "geometry_msgs/msg/Pose", "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/Point",
        "geometry_msgs/msg/Quaternion"))
    try:
        writer = BagWriter(output)
    except (BagExistsError, OSError) as error:
        raise ReplayError(f"cannot write the twin's response bag: {error}") from error
    try:
        writer.add_topic(f"{SIM_PREFIX}/joint_states", resolver.definition("sensor_msgs/msg/JointState"))
        writer.add_topic(f"{SIM_PREFIX}/box_pose", resolver.definition("geometry_msgs/msg/PoseStamped"))
        empty = np.zeros(0)
        for k in range(0, len(result.twin_t), every):
            stamp_ns = run.start_ns + int(round(result.twin_t[k] * 1e9))
            header = Header(stamp=Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000),
                            frame_id="")
            msg = JointState(header=header, name=list(result.joint_names), position=result.twin_q[k].copy(),
                             velocity=empty, effort=empty)
            writer.write(f"{SIM_PREFIX}/joint_states", store.serialize_cdr(msg, "sensor_msgs/msg/JointState"), stamp_ns)
            if k % 20 == 0:
                x, y, z = result.twin_box_xyz[k].tolist()
                box = PoseStamped(header=Header(stamp=header.stamp, frame_id="world"),
                                  pose=Pose(position=Point(x=x, y=y, z=z), orientation=Quaternion(x=0.0, y=0.0, z=0.0, w=1.0)))
                writer.write(f"{SIM_PREFIX}/box_pose", store.serialize_cdr(box, "geometry_msgs/msg/PoseStamped"), stamp_ns)
        writer.add_metadata("twinloop_replay", {"joint_rmse_rad": str(result.joint_rmse_rad.tolist()),
                                                "end_effector_rmse_m": str(result.end_effector_rmse_m)})
        writer.close()
    except BaseException as error:
        writer.abandon()
        shutil.rmtree(output, ignore_errors=True)  # only what this call created: the folder did not exist
        if isinstance(error, OSError):
            raise ReplayError(f"writing the twin's response bag {output} failed ({error}); nothing was kept") from error
        raise
    return output


def response_bag_path(output_dir: Path | str, bag_path: Path | str, version: int) -> Path:
    return Path(output_dir) / f"{Path(bag_path).name}-replay-v{version}"


def replay_bag(bag_path: Path | str, twin_path: Path | str, output_dir: Path | str | None = None,
               progress=lambda fraction, text: None) -> tuple[ReplayResult, Path | None]:
    """Load a twin and a bag, replay, optionally write the response bag."""
    from twinloop_twin.bundle import load_twin
    from twinloop_twin.nominal import load_scene, load_twin_workcell
    from twinloop_twin.residual import load_residual

    twin = load_twin(Path(twin_path))
    output = response_bag_path(output_dir, bag_path, twin.version) if output_dir else None
    if output is not None and (output.exists() or output.is_symlink()):
        raise ReplayError(f"{output} exists already; a replay never overwrites a bag: choose another output "
                          "folder or move the old response away")
    workcell = load_twin_workcell(twin)
    model = load_scene(twin)
    sim = WorkcellSimulation(workcell, model=model, residual=load_residual(twin, model))
    progress(0.05, f"reading {bag_path}")
    run = load_recorded_run(bag_path, list(sim.commandable_joints))
    progress(0.2, f"replaying {run.state_t[-1]:.1f} s in twin {twin.workcell} v{twin.version}")
    result = replay(run, sim, UrdfTransforms(workcell.urdf_xml))
    if output is not None:
        progress(0.9, "writing the twin's response bag")
        write_replay_bag(output, run, result)
    progress(1.0, "done")
    return result, output


def format_report(result: ReplayResult) -> str:
    lines = ["joint position RMSE, twin vs recorded (mrad):"]
    lines += [f"  {n:22s} {r * 1e3:8.3f}" for n, r in zip(result.joint_names, result.joint_rmse_rad)]
    lines.append(f"end-effector RMSE: {result.end_effector_rmse_m * 1e3:.2f} mm")
    if np.isfinite(result.box_final_position_error_m):
        lines.append(f"box final position error: {result.box_final_position_error_m * 1e3:.1f} mm")
    lines.append(f"time alignment: the twin's motion best matches shifted by {result.time_offset_s * 1e3:+.0f} ms")
    return "\n".join(lines)
