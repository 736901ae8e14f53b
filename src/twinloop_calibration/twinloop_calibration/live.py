"""A live calibration run without ROS: move to each planned pose through the envelope
monitor, wait until the arm settles, pair the next image with the joint state at its stamp.

Pure Python (no rclpy). `LiveRun` drives a `LiveCell`: the calibration server's node is one
(DDS topics and the envelope monitor's services), a test's in-process simulation is another.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from twinloop_calibration.degeneracy import CalibrationError
from twinloop_calibration.handeye import View
from twinloop_calibration.targets import Detection, TargetDetector, TargetNotFound
from twinloop_planning.execution import TargetStream
from twinloop_twin.motion import minimum_jerk

COMMAND_PERIOD_S = 0.004  # the envelope monitor's command period: one message is one step


def move_duration_s(start: np.ndarray, goal: np.ndarray, max_speed_rad_s: float) -> float:
    """Minimum-jerk duration whose peak joint speed (1.875 x mean) stays under max_speed."""
    return max(0.5, 1.875 * float(np.max(np.abs(goal - start))) / max_speed_rad_s)


def move_targets(start: np.ndarray, goal: np.ndarray, max_speed_rad_s: float,
                 period_s: float = COMMAND_PERIOD_S) -> list[np.ndarray]:
    duration = move_duration_s(start, goal, max_speed_rad_s)
    steps = int(np.ceil(duration / period_s))
    return [minimum_jerk(start, goal, duration, (k + 1) * period_s) for k in range(steps)]


@dataclass
class JointBuffer:
    """Recent joint states (stamp, arm positions, arm velocities), thread-safe."""

    joints: list[str]
    maxlen: int = 2500  # 5 s at 500 Hz
    _samples: deque = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.maxlen)

    def add(self, stamp_ns: int, names, positions, velocities) -> None:
        index = {n: i for i, n in enumerate(names)}
        if not all(j in index for j in self.joints):
            return
        q = np.array([positions[index[j]] for j in self.joints])
        v = np.array([velocities[index[j]] for j in self.joints]) if len(velocities) == len(names) else np.zeros(len(q))
        with self._lock:
            self._samples.append((stamp_ns, q, v))

    def latest(self):
        with self._lock:
            return self._samples[-1] if self._samples else None

    def at(self, stamp_ns: int, tolerance_s: float = 0.05) -> np.ndarray | None:
        """Positions interpolated at stamp_ns; None if the buffer does not cover it."""
        with self._lock:
            samples = list(self._samples)
        if not samples or stamp_ns < samples[0][0] - tolerance_s * 1e9 or stamp_ns > samples[-1][0] + tolerance_s * 1e9:
            return None
        stamps = np.array([s[0] for s in samples], dtype=np.int64)
        q = np.array([s[1] for s in samples])
        t = (stamps - stamps[0]) * 1e-9
        return np.array([np.interp((stamp_ns - stamps[0]) * 1e-9, t, q[:, j]) for j in range(q.shape[1])])

    def settled(self, target: np.ndarray, *, since_ns: int, position_tolerance: float,
                velocity_tolerance: float) -> bool:
        """Every sample after since_ns is near the target and slow."""
        with self._lock:
            recent = [s for s in self._samples if s[0] >= since_ns]
        if len(recent) < 10:
            return False
        return all(np.max(np.abs(q - target)) < position_tolerance and np.max(np.abs(v)) < velocity_tolerance
                   for _, q, v in recent)


def calibration_error(code: str, message: str) -> CalibrationError:
    """A CalibrationError with the given twinloop_interfaces ErrorCode name."""
    error = CalibrationError(message)
    error.code = code
    return error


@dataclass(frozen=True)
class Frame:
    stamp_ns: int  # on the clock of the joint-state stamps
    image: np.ndarray  # RGB


class LiveCell(Protocol):
    """What a live run needs from the cell. Every call may block; `fault()` is '' while the
    envelope monitor holds no fault."""

    joints: JointBuffer

    def now_ns(self) -> int: ...  # the clock of the joint-state and image stamps

    def sleep(self, seconds: float) -> None: ...

    def start_stream(self, stream: TargetStream) -> None: ...  # publish stream.next() every command period

    def stop_stream(self) -> None: ...

    def arm(self) -> None: ...  # raises CalibrationError when the monitor refuses

    def disarm(self) -> None: ...

    def fault(self) -> str: ...

    def next_image(self, camera: str, after_ns: int, timeout_s: float) -> Frame: ...  # raises TimeoutError

    # parent_T_child at a stamp from the cell's transforms (tf2 where installed); None when
    # the cell has none: the run then uses forward kinematics of the joint state at the stamp
    def frame_pose(self, parent: str, child: str, stamp_ns: int) -> np.ndarray | None: ...


@dataclass(frozen=True)
class LiveSettings:
    command_period_s: float = COMMAND_PERIOD_S  # the monitor's: one message is one step
    max_joint_speed_rad_s: float = 0.6  # peak joint speed of the moves
    plan_moves: bool = True  # moves through the motion planner (collision-free); False: straight minimum-jerk
    settle_position_tolerance_rad: float = 0.003
    settle_velocity_rad_s: float = 0.01
    settle_time_s: float = 0.3
    move_timeout_s: float = 8.0  # a pose not settled by then is skipped
    first_state_timeout_s: float = 30.0
    # s, wait for a camera's next image at a pose; a pose whose image is late is skipped,
    # and a second late pose in a row ends the run (the camera is not streaming)
    image_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, bool) and not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, not {value!r}")


@dataclass
class LiveViews:
    views: list[View]  # of the moving camera, with the gripper pose at each image
    detections: dict[str, list[Detection]]  # per camera
    skipped: list[int]  # poses not reached


class LiveRun:
    """The live sequence on a cell: arm, visit the poses, disarm (also on errors and cancel)."""

    def __init__(self, cell: LiveCell, detector: TargetDetector, forward_kinematics: Callable[[np.ndarray], np.ndarray],
                 settings: LiveSettings = LiveSettings(), *, log: Callable[[str], None] = lambda message: None,
                 plan_move: Callable[[np.ndarray, np.ndarray], list[np.ndarray]] | None = None,
                 frames: tuple[str, str] | None = None) -> None:
        """`plan_move(start, goal)`: the targets of a move, one per command period (the
        motion planner's); it raises ValueError for a move it cannot make safely. None:
        straight minimum-jerk moves (move_targets). `frames`: (base, gripper) frame names
        whose transform at each image's stamp the cell is asked for (`frame_pose`); None, or
        a cell without them: forward kinematics."""
        self.cell, self.detector, self.fk, self.settings, self.log = cell, detector, forward_kinematics, settings, log
        self.plan_move, self.frames = plan_move, frames
        self.stream: TargetStream | None = None

    def first_joint_state(self) -> np.ndarray:
        deadline = time.monotonic() + self.settings.first_state_timeout_s
        while self.cell.joints.latest() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no /joint_states received in {self.settings.first_state_timeout_s:.0f} s: is "
                                   "the workcell (or robot driver) running?")
            self.cell.sleep(0.1)
        return self.cell.joints.latest()[1]

    def collect(self, poses: Sequence[np.ndarray], moving_camera: str, static_camera: str | None = None, *,
                cancelled: Callable[[], bool] = lambda: False,
                feedback: Callable[[str, int, int], None] = lambda stage, views, planned: None) -> LiveViews:
        """Visit `poses` (arm joint positions); at each, an image of each camera."""
        out = LiveViews([], {c: [] for c in filter(None, (moving_camera, static_camera))}, [])
        late: dict[str, int] = {}  # per camera: the last pose whose image was late
        with self._streaming(self.first_joint_state()):
            for index, target in enumerate(poses):
                if cancelled():
                    raise calibration_error("CANCELED", f"canceled after {len(out.views)} views")
                feedback("moving", len(out.views), len(poses))
                if not self.move(np.asarray(target, dtype=float)):
                    self.log(f"pose {index} not reached; skipped")
                    out.skipped.append(index)
                    continue
                feedback("detecting", len(out.views), len(poses))
                for camera in out.detections:
                    frame = self._image(camera, index, late)
                    if frame is None:
                        continue
                    q = self.cell.joints.at(frame.stamp_ns)
                    try:
                        detection = self.detector.detect(frame.image)
                    except TargetNotFound as error:
                        self.log(f"pose {index}, {camera}: {error}")
                        continue
                    if camera == moving_camera and q is None:
                        continue
                    out.detections[camera].append(detection)
                    if camera == moving_camera:
                        out.views.append(View(self.gripper_pose(frame.stamp_ns, q), detection, label=str(index)))
        return out

    def _image(self, camera: str, index: int, late: dict[str, int]) -> Frame | None:
        """The camera's first image after now; None (the view skipped) where it is late at
        this pose only. A loaded host can stall a stream for seconds; a camera late at two
        poses in a row is not streaming, and that ends the run."""
        try:
            return self.cell.next_image(camera, self.cell.now_ns(), self.settings.image_timeout_s)
        except TimeoutError as error:
            if late.get(camera) == index - 1:
                raise
            late[camera] = index
            self.log(f"pose {index}, {camera}: {error}; the view is skipped")
            return None

    def gripper_pose(self, stamp_ns: int, q: np.ndarray) -> np.ndarray:
        """base_T_gripper at an image's stamp: the cell's transforms (`frames`: (base,
        gripper) frame names) where it has them, else forward kinematics of q."""
        if self.frames is not None:
            pose = self.cell.frame_pose(self.frames[0], self.frames[1], stamp_ns)
            if pose is not None:
                return pose
        return self.fk(q)

    @contextmanager
    def _streaming(self, hold: np.ndarray) -> Iterator[None]:
        """Stream targets (holding `hold` until a move) and arm the monitor for the block;
        then disarm first (the monitor ignores what follows) and stop the stream."""
        self.stream = TargetStream(hold)
        self.cell.start_stream(self.stream)
        try:
            self.cell.sleep(0.1)  # a few holds first: the monitor's first step is referenced to the measurement
            self.cell.arm()
            yield
        finally:
            try:
                self.cell.disarm()
            finally:
                self.cell.stop_stream()
                self.stream = None

    def check_monitor(self) -> None:
        fault = self.cell.fault()
        if fault:
            raise calibration_error("ENVELOPE_VIOLATION", f"the envelope monitor stopped the arm: {fault} (reset it "
                                    "with ~/reset_fault after checking the cell, then calibrate again)")

    def move(self, target: np.ndarray) -> bool:
        """Follow the planned path (or a straight minimum-jerk one) to `target`; True once the
        arm has settled there, False if it did not or no safe path was found."""
        s = self.settings
        if self.plan_move is None:
            targets = move_targets(self.stream.last, target, s.max_joint_speed_rad_s, s.command_period_s)
        else:
            try:
                targets = self.plan_move(self.stream.last, target)
            except ValueError as error:
                self.log(f"no safe path to the pose: {error}")
                return False
        self.stream.follow(targets)
        while not self.stream.idle():
            self.check_monitor()
            self.cell.sleep(0.02)
        deadline = self.cell.now_ns() + int(s.move_timeout_s * 1e9)
        while self.cell.now_ns() < deadline:
            self.check_monitor()
            since = self.cell.now_ns() - int(s.settle_time_s * 1e9)
            if self.cell.joints.settled(target, since_ns=since, position_tolerance=s.settle_position_tolerance_rad,
                                        velocity_tolerance=s.settle_velocity_rad_s):
                return True
            self.cell.sleep(0.05)
        return False
