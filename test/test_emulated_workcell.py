"""The emulated workcell over real DDS: the hardware contract, its rates, its hidden physics.

The workcell runs as a subprocess (as on a real install); the test talks to it from its
own rclpy context in its own ROS domain.
"""
from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import String
from tf2_msgs.msg import TFMessage
from twinloop_interfaces.msg import ErrorCode
from twinloop_interfaces.srv import ResetWorkcell

from twinloop_ros.messages import image_to_numpy
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.physics import load_physics
from twinloop_twin.workcell import default_config_dir, load_workcell

pytestmark = pytest.mark.ros

LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                     reliability=ReliabilityPolicy.RELIABLE)
WORKCELL = "twinloop_sim.emulated_workcell_node"
STARTUP_S = 30.0


class Workcell:
    """An emulated workcell process plus a probe node on the same private domain."""

    def __init__(self, tmp_path, **parameters) -> None:
        self.domain_id = fresh_domain_id()
        self.process = NodeProcess(WORKCELL, self.domain_id, parameters,
                                   log_path=tmp_path / f"workcell-{self.domain_id}.log")
        self.probe = RosProbe(self.domain_id)
        self.joint_states = self.probe.collect(JointState, "/joint_states")
        self.command_pub = self.probe.node.create_publisher(JointState, "/joint_command", 10)
        try:
            self.probe.wait_for(lambda: len(self.joint_states) > 50, STARTUP_S, "joint states")
        except TimeoutError:
            self.close()
            raise AssertionError(f"workcell did not start:\n{self.process.log()}")

    def latest(self) -> JointState:
        return self.joint_states[-1][1]

    def position(self, joint: str) -> float:
        msg = self.latest()
        return msg.position[list(msg.name).index(joint)]

    def command(self, names, positions) -> float:
        """Publish a position command; returns its stamp (s, system clock)."""
        msg = JointState(name=list(names), position=[float(p) for p in positions])
        now = self.probe.node.get_clock().now()
        msg.header.stamp = now.to_msg()
        self.command_pub.publish(msg)
        return now.nanoseconds * 1e-9

    def close(self) -> int:
        self.probe.close()
        return self.process.stop()


@pytest.fixture(scope="module")
def workcell(tmp_path_factory):
    cell = Workcell(tmp_path_factory.mktemp("workcell"), seed=3)
    yield cell
    cell.close()


@pytest.fixture(scope="module")
def description():
    return load_workcell()


def test_arm_reaches_commanded_target(workcell, description):
    home = description.home_joint_positions
    target = {"panda_joint2": home["panda_joint2"] + 0.25, "panda_joint4": home["panda_joint4"] + 0.3}
    workcell.command(target.keys(), target.values())
    time.sleep(2.5)
    for joint, value in target.items():
        # 2 mrad: encoder noise is 0.05 mrad; the servo's steady-state error is ~0.
        assert abs(workcell.position(joint) - value) < 2e-3, joint
    workcell.command(target.keys(), [home[j] for j in target])
    time.sleep(1.5)


def test_contract_rates(workcell):
    images = workcell.probe.collect(Image, "/static_camera/color/image_raw")
    depth = workcell.probe.collect(Image, "/wrist_camera/depth/image_rect_raw")
    info = workcell.probe.collect(CameraInfo, "/static_camera/color/camera_info")
    time.sleep(1.0)  # discovery
    # Nominal 500 Hz and 15 Hz (the declared emulated camera rate); generous bounds for a
    # loaded 2-core machine. Rendering both cameras takes most of a core, so a burst of load
    # from elsewhere on the host (one CI run saw 442 Hz and 8 Hz with the load average at 8)
    # skips frames for a while: the rates must hold over one of three 4 s windows, each
    # printed. A workcell that cannot make them (a wrong timer, a render too slow) fails all three.
    window_s, measured = 4.0, []
    for _ in range(3):
        start_js, start_img, start_depth = len(workcell.joint_states), len(images), len(depth)
        time.sleep(window_s)
        rates = ((len(workcell.joint_states) - start_js) / window_s, (len(images) - start_img) / window_s,
                 (len(depth) - start_depth) / window_s)
        measured.append(rates)
        print("measured: joint_states {:.0f} Hz, color {:.1f} Hz, depth {:.1f} Hz".format(*rates))
        js_rate, image_rate, depth_rate = rates
        if 400 <= js_rate <= 560 and 9 <= image_rate <= 17 and 9 <= depth_rate <= 17:
            break
    else:
        raise AssertionError(f"no 4 s window met 400-560 Hz joint states and 9-17 Hz images: {measured}")
    assert info and info[-1][1].k[0] > 0


def test_images_are_real_and_depth_is_metric(workcell, description):
    color = workcell.probe.collect(Image, "/static_camera/color/image_raw")
    depth = workcell.probe.collect(Image, "/static_camera/depth/image_rect_raw")
    info = workcell.probe.collect(CameraInfo, "/static_camera/depth/camera_info")
    tf_static = workcell.probe.collect(TFMessage, "/tf_static", LATCHED)
    workcell.probe.wait_for(lambda: color and depth and info and tf_static, 10.0, "camera topics")

    rgb = image_to_numpy(color[-1][1])
    assert rgb.shape == (480, 640, 3) and rgb.std() > 10.0, "color image is blank"

    depth_msg, camera_info = depth[-1][1], info[-1][1]
    depth_m = image_to_numpy(depth_msg).astype(float) / 1000.0
    world_T_camera = _chain(tf_static[-1][1], "world", depth_msg.header.frame_id)
    points = _deproject(depth_m, np.array(camera_info.k).reshape(3, 3))
    world_z = (points @ world_T_camera[:3, :3].T + world_T_camera[:3, 3])[:, 2]
    table_z = description.table_top_height_m
    on_table = np.abs(world_z - table_z) < 0.01
    assert on_table.mean() > 0.2, "the table should fill a large part of the static view"
    # Metric depth: the plane found in the image sits at the URDF's table height.
    assert abs(np.median(world_z[on_table]) - table_z) < 0.003


def test_latched_description_and_transforms(workcell):
    description = workcell.probe.collect(String, "/robot_description", LATCHED)
    tf_static = workcell.probe.collect(TFMessage, "/tf_static", LATCHED)
    tf = workcell.probe.collect(TFMessage, "/tf")
    workcell.probe.wait_for(lambda: description and tf_static and tf, 10.0, "latched topics")
    assert "panda_joint7" in description[-1][1].data and "static_camera_link" in description[-1][1].data
    static_children = {t.child_frame_id for t in tf_static[-1][1].transforms}
    assert {"wrist_camera_color_optical_frame", "static_camera_depth_optical_frame", "charuco_board"} <= static_children
    moving_children = {t.child_frame_id for t in tf[-1][1].transforms}
    assert {f"panda_link{i}" for i in range(1, 8)} <= moving_children


def test_wrong_joint_names_and_nan_are_rejected(workcell):
    diagnostics = workcell.probe.collect(DiagnosticArray, "/diagnostics")
    time.sleep(0.5)
    before = workcell.position("panda_joint1")
    workcell.command(["joint_a1", "panda_joint1"], [0.5, before + 0.4])
    workcell.probe.wait_for(lambda: any("UNKNOWN_JOINT" in s.message for _, d in diagnostics for s in d.status),
                            5.0, "unknown-joint diagnostic")
    workcell.command(["panda_joint1"], [math.nan])
    workcell.probe.wait_for(lambda: any("NON_FINITE_COMMAND" in s.message for _, d in diagnostics for s in d.status),
                            5.0, "NaN diagnostic")
    time.sleep(0.5)
    # Neither command moved the arm: the whole message is refused, not the bad entry alone.
    assert abs(workcell.position("panda_joint1") - before) < 2e-3
    message = next(s.message for _, d in diagnostics for s in d.status if "UNKNOWN_JOINT" in s.message)
    assert "joint_a1" in message and "panda_joint1" in message


def test_reset_service_puts_the_arm_at_the_requested_pose(workcell, description):
    client = workcell.probe.node.create_client(ResetWorkcell, "/emulated_workcell/reset")
    assert client.wait_for_service(timeout_sec=5.0)
    request = ResetWorkcell.Request(joint_names=["panda_joint1"], joint_positions=[0.3], reset_box=True)
    future = client.call_async(request)
    workcell.probe.wait_for(future.done, 5.0, "reset response")
    assert future.result().error.code == ErrorCode.NONE
    time.sleep(0.5)
    assert abs(workcell.position("panda_joint1") - 0.3) < 2e-3
    bad = client.call_async(ResetWorkcell.Request(joint_names=["elbow"], joint_positions=[0.0]))
    workcell.probe.wait_for(bad.done, 5.0, "reset response")
    assert bad.result().error.code == ErrorCode.UNKNOWN_JOINT
    home = description.home_joint_positions["panda_joint1"]
    workcell.probe.wait_for(client.call_async(ResetWorkcell.Request(
        joint_names=["panda_joint1"], joint_positions=[home])).done, 5.0, "reset")


def _step_latency_s(tmp_path, truth_file: str, steps: int = 5) -> tuple[float, float]:
    """Command-to-motion latency and 90 % rise time of 0.2 rad steps on joint 4 (up, down, ...):
    the medians over the steps. The hidden delay is in every step; the host's scheduling on a
    loaded host moves single steps either way (DDS delivery and the node's callback backlog
    add to it; a physics loop catching up after a hold-up stamps states early: one read
    6.1 ms against 13 ms for the others).
    """
    cell = Workcell(tmp_path, truth_file=truth_file, cameras_enabled=False, seed=5)
    latencies, rises = [], []
    try:
        time.sleep(1.0)
        for step in range(steps):
            start = cell.position("panda_joint4")
            direction = 1.0 if step % 2 == 0 else -1.0
            sent = cell.command(["panda_joint4"], [start + 0.2 * direction])
            time.sleep(1.5)
            # Header stamps, not receive times: both are the host's clock, and the probe's
            # Python callback backlog at 500 Hz would otherwise add milliseconds of jitter.
            samples = [(_seconds(m.header.stamp), m.position[list(m.name).index("panda_joint4")])
                       for _, m in list(cell.joint_states) if _seconds(m.header.stamp) > sent]
            moved = next(t for t, q in samples if abs(q - start) > 2e-3)
            risen = next(t for t, q in samples if (q - start) * direction > 0.18)
            latencies.append(moved - sent)
            rises.append(risen - sent)
    finally:
        assert cell.close() == 0
    print(f"{Path(truth_file).name}: latencies {', '.join(f'{x * 1e3:.1f}' for x in latencies)} ms")
    return float(np.median(latencies)), float(np.median(rises))


def test_second_truth_changes_the_step_response(tmp_path):
    config = default_config_dir()
    fast = _step_latency_s(tmp_path, str(config / "emulated_truth.yaml"))
    slow = _step_latency_s(tmp_path, str(config / "emulated_truth_slow.yaml"))
    delay_difference = (load_physics(config / "emulated_truth_slow.yaml").command_delay_s
                        - load_physics(config / "emulated_truth.yaml").command_delay_s)
    print(f"latency {fast[0] * 1e3:.1f} vs {slow[0] * 1e3:.1f} ms, rise {fast[1] * 1e3:.0f} vs {slow[1] * 1e3:.0f} ms")
    # The hidden delay shows in the measured latency (DDS and scheduling add a few ms to both).
    assert slow[0] - fast[0] == pytest.approx(delay_difference, abs=0.006)
    assert slow[1] > fast[1]


@pytest.mark.parametrize("edit, key", [
    (lambda text: text.replace("command_delay_ms:", "command_delay_ms: -3.0 #", 1), "command_delay_ms"),
    (lambda text: text + "unmodelled:\n  camera_offsets:\n    thermal_camera: {xyz_m: [0.01, 0, 0], rpy_deg: [0, 0, 0]}\n",
     "unmodelled.camera_offsets' names thermal_camera, not a camera of the workcell"),
])
def test_bad_truth_file_is_a_clear_error(tmp_path, edit, key):
    bad = tmp_path / "truth.yaml"
    bad.write_text(edit((default_config_dir() / "emulated_truth.yaml").read_text()))
    process = NodeProcess(WORKCELL, fresh_domain_id(), {"truth_file": str(bad)}, log_path=tmp_path / "log")
    assert process.process.wait(timeout=STARTUP_S) == 2
    log = process.log()
    process.stop()
    assert key in log and str(bad) in log and "Traceback" not in log, log


def test_missing_example_robot_data_is_a_clear_error(tmp_path):
    process = NodeProcess(WORKCELL, fresh_domain_id(), env={"TWINLOOP_EXAMPLE_ROBOT_DATA": str(tmp_path)},
                          log_path=tmp_path / "log")
    assert process.process.wait(timeout=STARTUP_S) == 2
    log = process.log()
    process.stop()
    assert "example-robot-data" in log and "pip install example-robot-data" in log


def test_sigterm_shuts_down_cleanly_with_the_camera_process(tmp_path):
    cell = Workcell(tmp_path)
    images = cell.probe.collect(Image, "/wrist_camera/color/image_raw")
    cell.probe.wait_for(lambda: images, 20.0, "camera images")
    cell.probe.close()
    assert cell.process.stop(signal.SIGTERM) == 0
    time.sleep(1.0)
    probe = RosProbe(cell.domain_id)
    try:
        late = probe.collect(Image, "/wrist_camera/color/image_raw")
        time.sleep(2.0)
        assert not late, "the camera process outlived the workcell"
    finally:
        probe.close()


def _seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def _chain(tf_message: TFMessage, parent: str, child: str) -> np.ndarray:
    by_child = {t.child_frame_id: t for t in tf_message.transforms}
    out = np.eye(4)
    frame = child
    while frame != parent:
        t = by_child[frame]
        out = _matrix(t.transform) @ out
        frame = t.header.frame_id
    return out


def _matrix(transform) -> np.ndarray:
    x, y, z, w = (transform.rotation.x, transform.rotation.y, transform.rotation.z, transform.rotation.w)
    rotation = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                         [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                         [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
    out = np.eye(4)
    out[:3, :3] = rotation
    out[:3, 3] = (transform.translation.x, transform.translation.y, transform.translation.z)
    return out


def _deproject(depth_m: np.ndarray, k: np.ndarray) -> np.ndarray:
    v, u = np.nonzero(depth_m > 0)
    z = depth_m[v, u]
    return np.stack([(u - k[0, 2]) * z / k[0, 0], (v - k[1, 2]) * z / k[1, 1], z], axis=1)
