"""Plays excitation trajectories on a workcell through the envelope monitor while the
recorder records an identification session. Helpers that attach to a node (no node of
their own) that another thread spins; the monitor and the recorder are driven through
twinloop_ros.clients, and their failures become `PlayerError`s that say what to do.
"""
from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
import time
from collections import Counter
from typing import Callable, Iterator, Mapping, Sequence

import mujoco
import numpy as np
from geometry_msgs.msg import PoseWithCovarianceStamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import SessionId
from twinloop_ros.clients import ClientError, EnvelopeClient, RecorderClient
from twinloop_ros.qos import COMMANDS, SENSOR
from twinloop_twin.contract import APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX, TRACKED_BOX_POSE_TOPIC
from twinloop_twin.physics import COMMANDED_JOINTS

from twinloop_builder.excitation import JointTrajectory, approach

# What an identification bag cannot do without, from its first message on.
REQUIRED_TOPICS = ("/joint_states", "/joint_command")
# A play that has published no row for STALL_REPORT_S prints every thread's stack on
# stderr, once per pause (a watcher thread, faulthandler.dump_traceback): the player's
# stream has paused 0.4-0.7 s on a loaded host for reasons not yet known, near the envelope
# monitor's command watchdog (1.0 s in config/envelope.yaml); the stacks say where the
# process stood. (faulthandler.dump_traceback_later re-armed per row would need no GIL, but
# each re-arm joins and starts a thread on the publishing path: ~0.2 ms here, more under load.)
STALL_REPORT_S, STALL_CHECK_S = 0.8, 0.05


class PlayerError(RuntimeError):
    """The session could not be played or recorded; the message says what to check."""


class ExcitationPlayer:
    """Publishes JointTrajectory rows on a command topic at their times (wall clock): the
    envelope monitor's input on a workcell, /joint_command itself only on a bench without one.

    Every row is published, in order, one period apart: the monitor reads each message as
    one step. When the player falls behind by more than a period (a loaded host) it shifts
    the rest of the schedule instead of publishing the late rows in a burst: the robot's
    target then pauses and goes on, where a burst would make it jump ahead by as many rows
    as were late (at 1 rad/s, 40 ms late is a 40 mrad jump of the target).

    With `pause_lead` (rad, m per joint), the player also paces itself to the robot: while
    the measured position lags the last published target by more than that on any joint,
    it holds the rest of the schedule, up to `max_pause_s` at a time, then shifts it. A
    monitor or workcell that falls behind the stream on a loaded host forwards the queued
    targets in a burst; unpaced, the target then runs ahead of the robot by the whole
    backlog (0.25 rad at 0.5-1 rad/s and 0.3-0.5 s behind) and the monitor's lead check
    stops the motion. Paced, the backlog is at most `pause_lead` ahead of the robot. A hold
    publishes nothing: the monitor reads each message as one step, and a held row sent again
    (a step of zero) between two moving ones reads as a stop and a restart within two periods,
    an acceleration far over its limit. (After the last row, where a trajectory is at rest,
    `holding()` sends it again while the monitor is disarmed.)
    """

    def __init__(self, node: Node, *, command_topic: str = "/twinloop/builder/command",
                 box_topic: str = TRACKED_BOX_POSE_TOPIC, joint_states_topic: str = "/joint_states",
                 limits: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
                 position_range: Mapping[str, tuple[float, float]] | None = None,
                 pause_lead: Mapping[str, float] | None = None, max_pause_s: float = 0.2,
                 plan_move: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> None:
        self.node = node
        # the motion planner's move from the measured pose to a trajectory's start (excitation.approach)
        self.plan_move = plan_move
        self.publisher = node.create_publisher(JointState, command_topic, COMMANDS)
        self.box_xyz: np.ndarray | None = None
        self.box_received = 0.0  # time.monotonic() of the last box pose
        self.box_topic = box_topic
        # (speed, acceleration) limits: with them, play() first moves from the measured
        # position to the trajectory's start (see excitation.approach).
        self.limits = limits
        # (lower, upper) per joint: the move from the measured pose starts inside them.
        self.position_range = dict(position_range or {})
        self.measured: dict[str, float] = {}
        self.schedule_shifts_s: list[float] = []  # how far each shifted the schedule, last play()
        self.pause_lead = dict(pause_lead or {})
        self.max_pause_s = max_pause_s
        self.pauses_s: list[float] = []  # each hold while the robot lagged, last play()
        self.lagging: Counter[str] = Counter()  # joints that lagged at the start of a hold, last play()
        self.longest_gap_s = 0.0  # longest time between two published rows, last play()
        self._last: tuple[list[str], np.ndarray] | None = None  # (joints, row) last published
        self._published = 0.0  # time.monotonic() of the last publish
        self._publish_lock = threading.Lock()
        node.create_subscription(JointState, joint_states_topic,
                                 lambda msg: self.measured.update(zip(msg.name, msg.position)),
                                 SENSOR)
        # the box as the camera sees it (the box tracker): what a real cell has
        node.create_subscription(PoseWithCovarianceStamped, box_topic, self._on_box, 10)

    def _on_box(self, msg: PoseWithCovarianceStamped) -> None:
        p = msg.pose.pose.position
        self.box_xyz = np.array([p.x, p.y, p.z])
        self.box_received = time.monotonic()

    def start_pose(self) -> dict[str, float]:
        """The measured pose, each joint clipped into its position range. A joint can read a
        hair beyond a limit (encoder noise at a stop: the gripper rests on its open stop at
        home); a move that starts from that reading would command a target beyond the limit."""
        pose = dict(self.measured)
        for joint, (lower, upper) in self.position_range.items():
            if joint in pose:
                pose[joint] = min(max(pose[joint], lower), upper)
        return pose

    def lead_in(self, trajectory: JointTrajectory) -> JointTrajectory | None:
        """The move from the measured pose to the trajectory's start (None: none needed).
        Planned before the monitor is armed (planning takes up to seconds; an armed monitor
        faults a stream that pauses that long)."""
        if self.limits is None:
            return None
        self.wait_for_joint_states(trajectory.joints)
        return approach(self.start_pose(), trajectory, max_speed=self.limits[0], max_acceleration=self.limits[1],
                        plan_move=self.plan_move, log=self.node.get_logger().warning)

    def play(self, trajectory: JointTrajectory, stop: Callable[[], bool] = lambda: False,
             lead: JointTrajectory | None | bool = True) -> float:
        """Publish the rows at their times; ends early once `stop()` is true (a monitor fault).
        `lead`: the move to the start (lead_in's, computed earlier), None for none, True to
        compute it here. Returns how long the move from the measured pose to the start took
        (0: none needed)."""
        if lead is True:
            lead = self.lead_in(trajectory)
        trajectory = lead.then(trajectory) if lead is not None else trajectory
        names = list(trajectory.joints)
        paced = [(names.index(j), limit) for j, limit in self.pause_lead.items() if j in names]
        periods = np.diff(trajectory.t, append=trajectory.t[-1])
        self.schedule_shifts_s, self.pauses_s, self.lagging = [], [], Counter()
        self.longest_gap_s = 0.0
        self._last = None
        due = time.monotonic()
        playing = threading.Event()
        playing.set()
        watcher = threading.Thread(target=self._report_stalls, args=(playing,), name="stall_report", daemon=True)
        watcher.start()
        try:
            for row, period in zip(trajectory.positions, periods):
                if stop():
                    break
                if self._last is not None and paced:
                    held = self._hold_while_lagging(names, self._last[1], paced)
                    if held > 0:
                        self.pauses_s.append(held)
                        due = max(due, time.monotonic())
                late = time.monotonic() - due
                if late < 0:
                    time.sleep(-late)
                elif late > period > 0:
                    due += late  # behind by more than a row: shift the schedule, do not bunch rows
                    self.schedule_shifts_s.append(late)
                self._publish(names, row)
                due += period
        finally:
            playing.clear()
            watcher.join()
        return lead.duration_s if lead is not None else 0.0

    def _report_stalls(self, playing: threading.Event) -> None:
        reported = started = time.monotonic()
        while playing.is_set():
            time.sleep(STALL_CHECK_S)
            last = max(self._published, started)
            silent = time.monotonic() - last
            if silent >= STALL_REPORT_S and reported < last and playing.is_set():
                reported = last
                print(f"excitation player: no command published for {silent:.2f} s mid-play; every thread's stack:",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def _publish(self, names: list[str], row: np.ndarray) -> None:
        with self._publish_lock:
            msg = JointState(name=names, position=[float(v) for v in row])
            msg.header.stamp = self.node.get_clock().now().to_msg()
            self.publisher.publish(msg)
            now = time.monotonic()
            if self._last is not None:
                self.longest_gap_s = max(self.longest_gap_s, now - self._published)
            self._last, self._published = (names, row), now

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While open, a thread publishes the last row again each time the stream has been
        silent for max_pause_s: the robot holds and the stream stays alive, e.g. while the
        monitor is being disarmed (a service call that can take longer than its command
        watchdog on a loaded host: a stream that stops at its last row before the monitor takes
        the disarm request is faulted as stalled). A disarm that is answered within max_pause_s
        sees no row again; one sent after the monitor disarmed is refused there (counted as
        rejected, nothing moves). Only for a trajectory that ended at rest (every excitation
        does): a row sent again is a step of zero, and after a moving row that reads as an
        acceleration over the monitor's limit."""
        done = threading.Event()

        def repeat() -> None:
            while self._last is not None and not done.wait(max(0.0, self._published + self.max_pause_s
                                                                - time.monotonic())):
                if time.monotonic() - self._published >= self.max_pause_s:
                    self._publish(*self._last)

        thread = threading.Thread(target=repeat, name="hold-last-row", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=1.0)

    def _hold_while_lagging(self, names: Sequence[str], sent: np.ndarray, paced) -> float:
        """Wait while the measured position lags `sent` by more than its pause lead on any
        joint, at most max_pause_s; returns how long it waited (0: no lag)."""
        began = time.monotonic()
        waited = False
        while time.monotonic() - began < self.max_pause_s:
            measured = self.measured
            lagging = [names[i] for i, limit in paced if abs(sent[i] - measured.get(names[i], sent[i])) > limit]
            if not lagging:
                break
            if not waited:
                self.lagging.update(lagging)
            waited = True
            time.sleep(0.002)
        return time.monotonic() - began if waited else 0.0

    def wait_for_joint_states(self, joints: Sequence[str], timeout_s: float = 10.0) -> None:
        """Return once every joint of `joints` has been measured. The move to a trajectory's
        start starts from the measured pose: without one it would start from the trajectory's
        first row, wherever the robot is (a subscription can take seconds to match on a
        loaded host, longer than the recorder's)."""
        deadline = time.monotonic() + timeout_s
        while missing := [j for j in joints if j not in self.measured]:
            if time.monotonic() > deadline:
                raise PlayerError(f"no joint state of {', '.join(missing)} within {timeout_s:.0f} s: is the robot "
                                  "driver (or the emulated workcell) running on this ROS_DOMAIN_ID?")
            time.sleep(0.02)

    def wait_for_box(self, timeout_s: float = 15.0) -> np.ndarray:
        """The box's position from a pose received after this call (the box may just have been pushed).
        The wait allows for a tracker that has just started, or whose cameras deliver 1-2 frames a
        second on a loaded host. With 5 s, a tracker started beside the excitation (up 14 s after
        the workcell, 5 s before the wait ran out) ended a push excitation before its first push."""
        asked = time.monotonic()
        deadline = asked + timeout_s
        while self.box_received <= asked and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.box_received <= asked:
            raise PlayerError(f"no box pose on {self.box_topic} within {timeout_s:.0f} s: start the box tracker "
                              "(`twinloop bringup` starts it) with the static camera running, and read "
                              "/box_tracker/status for why it does not see the box")
        return self.box_xyz.copy()


class ExcitationMonitor:
    """The envelope monitor, armed for each played trajectory and disarmed right after (its
    command watchdog faults when an armed stream stops); reports a fault it latched."""

    def __init__(self, node: Node, monitor: str = "/envelope_monitor") -> None:
        self.client = EnvelopeClient(node, monitor=monitor)

    def set_armed(self, armed: bool, timeout_s: float = 5.0) -> None:
        try:
            self.client.set_armed(armed, timeout_s)
        except ClientError as error:
            raise PlayerError(str(error)) from error

    def faulted(self) -> bool:
        return self.client.faulted()

    def check(self, what: str) -> None:
        if self.faulted():
            raise PlayerError(f"the envelope monitor stopped {what}: {self.client.fault_text()}; the robot holds. "
                              "Lower the excitation (amplitudes, band) or widen config/envelope.yaml, then reset "
                              "the fault (~/reset_fault)")


class IdentificationRecorder:
    """Identification sessions of the twinloop recorder (`/recorder/start`, `/recorder/stop`)."""

    def __init__(self, node: Node, recorder: str = "/recorder") -> None:
        self.node = node
        self.client = RecorderClient(node, recorder=recorder)

    def start(self, *, split: str, output_dir: str = "", note: str = "", twin_version: str = "",
              timeout_s: float = 10.0, required_topics: Sequence[str] = REQUIRED_TOPICS,
              profile: str = "identification") -> str:
        """Start a session and return once the recorder records `required_topics` and the
        applied-command and box-pose topics (simulator's, tracker's) published on the graph (the recorder
        subscribes as it discovers their publishers); else stop it and raise."""
        # published ones only: this process's player subscribes to the tracked box pose itself
        seen = [t for t, _ in self.node.get_topic_names_and_types() if t.startswith("/twinloop/")
                and t.endswith((APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX)) and self.node.count_publishers(t) > 0
                and profile == "identification"]
        try:
            bag_path = self.client.start(profile=profile, purpose=SessionId.PURPOSE_IDENTIFICATION,
                                         split=split, output_dir=output_dir, note=note, twin_version=twin_version,
                                         timeout_s=timeout_s)
        except ClientError as error:
            raise PlayerError(str(error)) from error
        try:
            self.client.wait_until_recording(bag_path, [*required_topics, *seen], timeout_s)
        except ClientError as error:
            self.stop()
            raise PlayerError(str(error)) from error
        return bag_path

    def stop(self, timeout_s: float = 20.0) -> str:
        try:
            return self.client.stop(timeout_s)
        except ClientError as error:
            raise PlayerError(str(error)) from error


def joint_ranges(model: mujoco.MjModel, joints: Sequence[str] = COMMANDED_JOINTS) -> dict[str, tuple[float, float]]:
    """(lower, upper) position range of each of `joints` in a compiled scene (the URDF's limits)."""
    return {j: (float(model.jnt_range[model.joint(j).id][0]), float(model.jnt_range[model.joint(j).id][1]))
            for j in joints}
