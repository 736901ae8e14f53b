"""A recorded identification session as arrays, read from a bag. Pure Python (no rclpy).

Times are seconds from the first joint state. A command's time is when it took effect on
the workcell. A simulated workcell records that (`/twinloop/<node>/applied_command`,
stamped on the physics clock), and then it is exact. Otherwise (a real driver) it is the
log time (when the recorder, on the workcell host, received it) moved to the start of the
control period it arrived in: a workcell applies a command from the start of the period in
which it arrives, so one logged in (t_{k-1}, t_k] (joint-state stamps) is in force from
t_{k-1}. Over DDS on a loaded host the log time can be milliseconds off the driver's, which
biases the identified command delay by as much.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twinloop_twin.contract import APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX, TRACKED_BOX_POSE_TOPIC, simulated_topic
from twinloop_twin.physics import ALL_JOINTS, COMMANDED_JOINTS

STATE_TOPIC = "/joint_states"
COMMAND_TOPIC = "/joint_command"
# Where the box's poses come from: the box tracker's (what a real cell has; the default) or
# a simulator's ground truth (for tests and benchmarks that score identification).
BOX_SOURCES = ("tracked", "ground_truth")


class RecordingError(ValueError):
    """A recording cannot be used for identification; the message says why and what to do."""

    code = "CORRUPT_INPUT"  # a twinloop_interfaces/ErrorCode name


class MissingTopic(RecordingError):
    code = "MISSING_TOPIC"


class WrongJointNames(RecordingError):
    code = "UNKNOWN_JOINT"


class WrongSplit(RecordingError):
    code = "WRONG_SPLIT"


class TooShort(RecordingError):
    code = "DEGENERATE_DATA"


@dataclass
class RecordedMotion:
    """One continuous recording of the robot's motion as arrays: joint states, the commands
    in force, optionally the box pose. (twinloop_logging.recording.SessionWriter is the
    recorder's bag being written; this is a bag read back for identification.)"""

    name: str
    state_t: np.ndarray  # (N,) s
    position: np.ndarray  # (N, 9) in ALL_JOINTS order; rad (m for fingers)
    velocity: np.ndarray  # (N, 9)
    effort: np.ndarray  # (N, 9) N*m (N); actuator torque including gravity compensation
    command_t: np.ndarray  # (M,) s, when each command took effect (see the module docstring)
    command: np.ndarray  # (M, 8) full target vector (COMMANDED_JOINTS order) in force after it
    box_t: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (K,) s
    box_pose: np.ndarray = field(default_factory=lambda: np.zeros((0, 7)))  # (K, 7) xyz + quat wxyz
    split: str = "fit"
    purpose: str = "identification"
    path: str = ""
    sha256: str = ""
    command_timing: str = "applied"  # 'applied' (workcell's own stamps) or 'log' (recorder receive time)
    box_source: str = "tracked"  # one of BOX_SOURCES

    @property
    def duration_s(self) -> float:
        return float(self.state_t[-1] - self.state_t[0]) if len(self.state_t) else 0.0

    def commands_on_grid(self, grid_t: np.ndarray) -> np.ndarray:
        """(len(grid_t), 8) targets in force on a time grid (a command at t_c rules from the first t >= t_c)."""
        # 100 ns tolerance: a command logged exactly on a grid point rules from that point
        index = np.searchsorted(self.command_t, np.asarray(grid_t) + 1e-7, side="right") - 1
        initial = self.position[0, [ALL_JOINTS.index(j) for j in COMMANDED_JOINTS]]
        out = np.where(index[:, None] >= 0, self.command[np.clip(index, 0, None)], initial[None, :])
        return out

    def motion_range(self) -> dict[str, float]:
        """Peak-to-peak travel of each joint over the recording (rad or m)."""
        return {j: float(np.ptp(self.position[:, i])) for i, j in enumerate(ALL_JOINTS)}

    def window(self, start_s: float, end_s: float, name: str | None = None) -> "RecordedMotion":
        """The part of the recording in [start_s, end_s] (times keep their origin)."""
        s = (self.state_t >= start_s) & (self.state_t <= end_s)
        b = (self.box_t >= start_s) & (self.box_t <= end_s)
        return RecordedMotion(name or f"{self.name}[{start_s:.1f},{end_s:.1f}]", self.state_t[s], self.position[s],
                         self.velocity[s], self.effort[s], self.command_t, self.command, self.box_t[b],
                         self.box_pose[b], self.split, self.purpose, self.path, self.sha256, self.command_timing,
                         self.box_source)


def bag_sha256(path: Path | str) -> str:
    """Content hash of a bag: a rosbag2 folder hashes every file in it (sorted by name)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() if path.is_dir() else file.name.encode())
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def load_recording(path: Path | str, *, expected_split: str | None = None, min_duration_s: float = 5.0,
                   purposes: tuple[str, ...] = ("identification", "trial", "demonstration"),
                   box_source: str = "tracked") -> RecordedMotion:
    """Read a bag recorded with the 'identification' (or 'trial') profile.

    The box's poses are the box tracker's (`TRACKED_BOX_POSE_TOPIC`), or with
    box_source='ground_truth' a simulator's own (tests and benchmarks only).

    Raises RecordingError subclasses: MissingTopic, WrongJointNames, WrongSplit, TooShort.
    """
    from twinloop_logging.bag_reader import BagError, open_bag  # rosbags import is slow; only here
    from twinloop_twin.contract import CommandRejected, parse_joint_command

    path = Path(path)
    try:
        with open_bag(path) as bag:
            session = bag.session
            split = session.split if session else ""
            purpose = session.purpose if session else ""
            if expected_split is not None:
                if not session:
                    raise WrongSplit(f"bag {path} carries no session metadata, so its split is unknown; record it "
                                     f"with the twinloop recorder (split '{expected_split}')")
                if split != expected_split:
                    raise WrongSplit(
                        f"bag {path} was recorded as split '{split}' but was given as '{expected_split}' data: "
                        f"{'held-out recordings validate the twin and never fit it' if split == 'held_out' else 'fit recordings cannot validate the twin'}; "
                        f"pass it in the right list")
            if session and purpose not in purposes:
                raise RecordingError(f"bag {path} has purpose '{purpose}', not one of {list(purposes)}: "
                                     "record an identification session (twinloop build excite)")
            for topic in (STATE_TOPIC, COMMAND_TOPIC):
                if topic not in bag.topics or bag.topics[topic].count == 0:
                    raise MissingTopic(f"bag {path} has no {topic} messages (topics: {sorted(bag.topics)}); "
                                       "record with the 'identification' profile while commands are sent")
            states = bag.joint_states(STATE_TOPIC)
            missing = [j for j in ALL_JOINTS if j not in states.names]
            if missing:
                raise WrongJointNames(f"bag {path}: {STATE_TOPIC} names {states.names}, lacking {missing} of this "
                                      "workcell; was it recorded on another robot?")
            columns = [states.names.index(j) for j in ALL_JOINTS]
            t0 = int(states.stamps_ns[0])
            state_t = (states.stamps_ns - t0) * 1e-9
            position = states.position[:, columns]
            if not np.all(np.isfinite(position)):
                raise RecordingError(f"bag {path}: some {STATE_TOPIC} messages lack positions of the arm joints")
            velocity = np.nan_to_num(states.velocity[:, columns])
            effort = states.effort[:, columns]
            targets = dict(zip(COMMANDED_JOINTS, position[0, [ALL_JOINTS.index(j) for j in COMMANDED_JOINTS]]))
            counts = {t: info.count for t, info in bag.topics.items()}
            applied = simulated_topic(counts, APPLIED_COMMAND_SUFFIX)
            command_t, command = [], []
            for message in bag.messages([applied or COMMAND_TOPIC]):
                try:
                    targets.update(parse_joint_command(message.msg.name, message.msg.position, COMMANDED_JOINTS))
                except CommandRejected as error:
                    raise WrongJointNames(f"bag {path}: a recorded command does not fit this workcell: {error}") from error
                stamp = message.msg.header.stamp
                when_ns = int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec) if applied else message.log_time_ns
                command_t.append((when_ns - t0) * 1e-9)
                command.append([targets[j] for j in COMMANDED_JOINTS])
            if box_source not in BOX_SOURCES:
                raise ValueError(f"box_source must be one of {BOX_SOURCES}, got {box_source!r}")
            box_topic = (simulated_topic(counts, BOX_POSE_SUFFIX) if box_source == "ground_truth"
                         else TRACKED_BOX_POSE_TOPIC if counts.get(TRACKED_BOX_POSE_TOPIC) else None)
            box_t, box_pose = np.zeros(0), np.zeros((0, 7))
            if box_topic:
                stamped = [m.msg for m in bag.messages([box_topic])]
                box_t = np.array([(int(p.header.stamp.sec) * 1_000_000_000 + int(p.header.stamp.nanosec) - t0) * 1e-9
                                  for p in stamped])
                poses = [p.pose.pose if box_topic == TRACKED_BOX_POSE_TOPIC else p.pose for p in stamped]
                box_pose = np.array([[p.position.x, p.position.y, p.position.z, p.orientation.w,
                                      p.orientation.x, p.orientation.y, p.orientation.z] for p in poses])
                order = np.argsort(box_t, kind="stable")
                box_t, box_pose = box_t[order], box_pose[order]
    except BagError as error:
        raise RecordingError(str(error)) from error
    order = np.argsort(command_t, kind="stable")
    command_t = np.asarray(command_t)[order]
    if not applied:
        # A workcell applies a command from the start of the control period in which it arrives
        # (the joint-state stamps mark the periods): logged in (t_{k-1}, t_k], it rules from t_{k-1}.
        period = np.searchsorted(state_t, command_t + 1e-7, side="right") - 1
        command_t = np.where(period >= 0, state_t[np.clip(period, 0, None)], command_t)
    recording = RecordedMotion(path.name, state_t, position, velocity, effort, command_t,
                          np.asarray(command, dtype=float).reshape(-1, len(COMMANDED_JOINTS))[order],
                          box_t, box_pose, split or "fit", purpose or "identification", str(path), bag_sha256(path),
                          "applied" if applied else "log", box_source)
    check_recording(recording, min_duration_s=min_duration_s)
    return recording


def check_recording(recording: RecordedMotion, *, min_duration_s: float) -> None:
    if recording.duration_s < min_duration_s:
        raise TooShort(f"recording {recording.name} lasts {recording.duration_s:.1f} s, shorter than the "
                       f"{min_duration_s:.1f} s identification needs: record a longer excitation "
                       "(twinloop build excite --duration ...)")
    if len(recording.command_t) == 0:
        raise MissingTopic(f"recording {recording.name} holds no command: nothing excited the robot")
    if not np.all(np.isfinite(recording.effort[:, [ALL_JOINTS.index(j) for j in COMMANDED_JOINTS]])):
        raise MissingTopic(f"recording {recording.name}: {STATE_TOPIC} carries no effort for every commanded "
                           "joint; gains and the command delay are identified from it")
