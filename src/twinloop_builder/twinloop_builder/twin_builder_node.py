"""Twin builder node: the `~/build` action (twinloop_interfaces/action/BuildTwin).

A goal names the workcell, the parent version, the fit bags and the held-out bags; the
node identifies the physics (twinloop_builder.build, pure Python), writes the next twin
version and answers with its number, the held-out RMSE before and after, and what could
not be identified. A goal with a scan bag instead builds the next version's geometry
(twinloop_builder.geometry.from_scan). Feedback carries the stage, the whole build's 0..1
progress (twinloop_builder.progress) and a message; a cancel request stops the optimizer at
its next iteration and writes nothing.
The latest version's measured geometry (scan surface, scanned objects) is published
latched on `~/geometry_markers` for RViz, at start and after each build. Every
`status_period_s` the newest version's standing (twinloop_twin.status: current, STALE with
the evidence, or not checked; validation rounds record it) goes to `/diagnostics` and, as a
text marker above the table, latched on `~/twin_status`.
"""
from __future__ import annotations

import threading
from pathlib import Path

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from twinloop_interfaces.action import BuildTwin
from twinloop_interfaces.msg import ErrorCode

from diagnostic_msgs.msg import DiagnosticArray

from twinloop_builder.build import build_identified_twin
from twinloop_builder.geometry.from_scan import SCAN_ERRORS, ScanBuildSettings, build_geometry_from_scan
from twinloop_builder.geometry.markers import geometry_markers
from twinloop_builder.identification import IdentificationCancelled, IdentificationError, IdentificationSettings
from twinloop_builder.recording import RecordingError
from twinloop_builder.progress import BuildProgress
from twinloop_builder.twin_status import diagnostic, newest_standing, status_marker
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_ros.qos import LATCHED, RELIABLE
from twinloop_twin.bundle import TwinError, TwinIntegrityError, TwinVersionExists, latest_version, load_twin_version
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray



class TwinBuilder(Node):
    def __init__(self) -> None:
        super().__init__("twin_builder")
        # a literal table: test/test_workspace_files.py reads it to check config/builder.yaml
        self.p = declare(self, {
            "twins_root": ("twins", "folder holding twins/<workcell>/v<N> (relative: to the working directory)"),
            "default_workcell": ("emulated", "workcell of goals that name none"),
            "max_iterations": (12, "Levenberg-Marquardt iterations per identification stage"),
            "confidence": (0.95, "level of the reported confidence intervals (0..1)"),
            "interval_lag_s": (0.2, "s, lag window of the intervals' Newey-West covariance"),
            "residual": ("auto", "auto: a learned residual where identification leaves a systematic error; off: never"),
            "max_relative_std": (0.1, "a parameter is identifiable when its std is at most this fraction of its value"),
            "min_duration_s": (5.0, "s, shortest fit recording accepted"),
            "position_std_rad": (1.0e-4, "rad, joint position noise used to weight residuals"),
            "effort_std_nm": (0.1, "N*m, joint effort noise used to weight residuals"),
            "box_position_std_m": (0.001, "m, box position noise used to weight residuals"),
            "scan_voxel_m": (0.004, "m, TSDF voxel of geometry builds from a scan"),
            "status_period_s": (5.0, "s, how often the newest version's standing goes to /diagnostics and "
                                     "~/twin_status"),
        })
        if not 0.0 < self.p["confidence"] < 1.0:
            raise StartupError(f"confidence must be in (0, 1), got {self.p['confidence']}")
        if (self.p["max_iterations"] < 1 or self.p["min_duration_s"] <= 0 or not self.p["status_period_s"] > 0
                or not self.p["interval_lag_s"] > 0):
            raise StartupError("max_iterations must be >= 1, min_duration_s, status_period_s and interval_lag_s > 0")
        if self.p["residual"] not in ("auto", "off"):
            raise StartupError(f"residual must be 'auto' or 'off', got {self.p['residual']!r}")
        self.settings = IdentificationSettings(
            residual=self.p["residual"],
            max_iterations=self.p["max_iterations"], confidence=self.p["confidence"],
            interval_lag_s=self.p["interval_lag_s"],
            max_relative_std=self.p["max_relative_std"], min_duration_s=self.p["min_duration_s"],
            position_std_rad=self.p["position_std_rad"], effort_std_nm=self.p["effort_std_nm"],
            box_position_std_m=self.p["box_position_std_m"])
        self._busy = threading.Lock()
        # Reentrant group + MultiThreadedExecutor: a build runs for minutes in its execute
        # callback while goal, cancel and feedback traffic must keep flowing.
        self._server = ActionServer(self, BuildTwin, "~/build", execute_callback=self.execute,
                                    goal_callback=self.on_goal, cancel_callback=lambda _: CancelResponse.ACCEPT,
                                    callback_group=ReentrantCallbackGroup())
        self.markers_pub = self.create_publisher(MarkerArray, "~/geometry_markers", LATCHED)
        # Once, off the start-up path: loading a twin and decimating its scan surface takes up to ~0.5 s.
        self._first_markers = self.create_timer(0.0, self._publish_first_markers)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", RELIABLE)
        self.status_pub = self.create_publisher(MarkerArray, "~/twin_status", LATCHED)
        self._status_timer = self.create_timer(self.p["status_period_s"], self.publish_status)
        self.get_logger().info(f"twin builder up: twins in {Path(self.p['twins_root']).resolve()}")

    def _publish_first_markers(self) -> None:
        self._first_markers.cancel()
        self.publish_geometry(self.p["default_workcell"])

    def publish_status(self) -> None:
        workcell = self.p["default_workcell"]
        version, verdict, problem = newest_standing(self.p["twins_root"], workcell)
        status = diagnostic(workcell, version, verdict, problem)
        self.diagnostics_pub.publish(DiagnosticArray(header=Header(stamp=self.get_clock().now().to_msg()),
                                                     status=[status]))
        self.status_pub.publish(status_marker(workcell, version, verdict))

    def publish_geometry(self, workcell: str) -> None:
        """The latest version's geometry on ~/geometry_markers (nothing when there is no twin)."""
        try:
            if latest_version(self.p["twins_root"], workcell) is None:
                return
            self.markers_pub.publish(geometry_markers(load_twin_version(self.p["twins_root"], workcell)))
        except TwinError as error:
            self.get_logger().warning(f"no geometry markers for {workcell}: {error}")

    def on_goal(self, goal: BuildTwin.Goal) -> GoalResponse:
        if self._busy.locked():
            self.get_logger().warning("a build is running; goal rejected (send it again when it is done)")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def execute(self, goal_handle) -> BuildTwin.Result:
        goal = goal_handle.request
        result = BuildTwin.Result(version=-1)
        workcell = goal.workcell or self.p["default_workcell"]

        def progress(stage: str, fraction: float, message: str) -> None:
            goal_handle.publish_feedback(BuildTwin.Feedback(stage=stage, progress=float(fraction), message=message))
            self.get_logger().info(message)

        if goal.scan_bag:  # the scan build's fractions are of the whole build already
            return self.build_geometry(goal_handle, workcell, progress)
        # The identification's stages report fractions of themselves; feedback carries the
        # whole build's (twinloop_builder.progress), as `twinloop build` prints it.
        tracker = BuildProgress()
        with self._busy:
            try:
                built = build_identified_twin(
                    self.p["twins_root"], workcell, list(goal.fit_bags), list(goal.held_out_bags),
                    parent_version=None if goal.parent_version < 0 else goal.parent_version,
                    select=list(goal.parameters), settings=self.settings, plan=tracker.plan,
                    progress=lambda stage, fraction, message: progress(stage, tracker.update(stage, fraction).fraction,
                                                                       message),
                    cancelled=lambda: goal_handle.is_cancel_requested)
            except IdentificationCancelled as error:
                goal_handle.canceled()
                result.error = ErrorCode(code=ErrorCode.CANCELED, message=f"{error}; nothing was written")
                return result
            except (RecordingError, IdentificationError, TwinError) as error:
                result.error = ErrorCode(code=_code(error), message=str(error))
                self.get_logger().error(str(error))
                goal_handle.abort()
                return result
        r = built.result
        result.error = ErrorCode(code=ErrorCode.NONE, message="")
        result.version = built.twin.version
        result.twin_path = str(built.twin.path)
        result.held_out_rmse_before = r.held_out_rmse_before_rad
        result.held_out_rmse_after = r.held_out_rmse_after_rad
        result.not_identifiable = r.not_identifiable
        goal_handle.succeed()
        return result

    def build_geometry(self, goal_handle, workcell: str, progress) -> BuildTwin.Result:
        goal, result = goal_handle.request, BuildTwin.Result(version=-1)
        if goal.fit_bags or goal.held_out_bags:
            result.error = ErrorCode(code=ErrorCode.INVALID_ARGUMENT, message="a goal with a scan bag builds geometry "
                                     "only: send the fit and held-out bags in a goal of their own")
            goal_handle.abort()
            return result
        with self._busy:
            try:
                built = build_geometry_from_scan(
                    self.p["twins_root"], workcell, goal.scan_bag, calibration=goal.scan_calibration or None,
                    parent_version=None if goal.parent_version < 0 else goal.parent_version, progress=progress,
                    settings=ScanBuildSettings(voxel_size_m=self.p["scan_voxel_m"]))
            except (*SCAN_ERRORS, RecordingError, TwinError) as error:
                message = " ".join(str(error).split())
                result.error = ErrorCode(code=_code(error), message=message)
                self.get_logger().error(message)
                goal_handle.abort()
                return result
        self.publish_geometry(workcell)
        result.error = ErrorCode(code=ErrorCode.NONE, message="")
        result.version, result.twin_path = built.twin.version, str(built.twin.path)
        result.summary = built.summary()
        goal_handle.succeed()
        return result


def _code(error: Exception) -> int:
    if isinstance(error, TwinVersionExists):
        return ErrorCode.TWIN_VERSION_EXISTS
    if isinstance(error, TwinIntegrityError):
        return ErrorCode.TWIN_INTEGRITY
    if isinstance(error, TwinError):
        return ErrorCode.FILE_NOT_FOUND if "does not exist" in str(error) or "has no twin" in str(error) \
            else ErrorCode.BAD_CONFIGURATION
    name = getattr(error, "code", "INVALID_ARGUMENT")
    if isinstance(error, RecordingError) and "no bag at" in str(error):
        name = "FILE_NOT_FOUND"
    return getattr(ErrorCode, name, ErrorCode.INVALID_ARGUMENT)


def main(args=None) -> None:
    run_node(TwinBuilder, args, executor=MultiThreadedExecutor)


if __name__ == "__main__":
    main()
