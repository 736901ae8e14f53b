"""The embedded bring-up (no ROS 2 launch here): the full node set comes up against the
emulated workcell, and everything RViz is configured to show is on the graph."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from twinloop_ros.testing import RosProbe, fresh_domain_id, localhost_env
from twinloop_twin.nominal import build_nominal_twin
from twinloop_twin.workcell import default_config_dir

pytestmark = pytest.mark.ros

EXPECTED_TOPICS = {
    "/joint_states", "/joint_command", "/tf", "/tf_static", "/robot_description", "/diagnostics",
    "/wrist_camera/color/image_raw", "/static_camera/depth/image_rect_raw", "/static_camera/color/camera_info",
    "/recorder/status", "/twinloop/envelope/status", "/twinloop/envelope/markers", "/twinloop/policy/command",
    "/twinloop/sim/joint_states", "/twinloop/twin/scene_markers", "/ghost_state_publisher/robot_description",
    "/twinloop/perception/box_pose", "/box_tracker/status", "/box_tracker/markers", "/twin_builder/geometry_markers",
}
EXPECTED_SERVICES = {"/recorder/start", "/recorder/stop", "/recorder/annotate", "/envelope_monitor/set_armed",
                     "/envelope_monitor/reset_fault", "/emulated_workcell/reset"}
EXPECTED_ACTIONS = {"/policy_runner/run_trials", "/calibration_server/calibrate", "/replay_server/replay"}


def _rviz_topics() -> set[str]:
    config = yaml.safe_load((default_config_dir() / "twinloop.rviz").read_text())
    topics = set()
    for display in config["Visualization Manager"]["Displays"]:
        for key in ("Topic", "Description Topic"):
            if key in display:
                topics.add(display[key]["Value"])
    return topics


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    work = tmp_path_factory.mktemp("bringup")
    build_nominal_twin(work / "twins", "emulated")  # the replay server shows the latest twin's scene
    domain = fresh_domain_id()
    log = open(work / "bringup.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "twinloop_bringup.bringup", "--log-dir", str(work / "log")],
                               cwd=work, env=localhost_env(domain), stdout=log, stderr=subprocess.STDOUT)
    probe = RosProbe(domain)
    try:
        deadline = time.monotonic() + 90.0
        topics = services = set()
        while time.monotonic() < deadline:
            topics = {t for t, _ in probe.node.get_topic_names_and_types()}
            services = {s for s, _ in probe.node.get_service_names_and_types()}
            published = {t for t in topics if probe.node.count_publishers(t) > 0}
            # Every node starts in its own process, each at its own pace (the policy runner and
            # the calibration server load torch and OpenCV): wait for the action servers too.
            action_services = {f"{a}/_action/send_goal" for a in EXPECTED_ACTIONS}
            if (EXPECTED_TOPICS | _rviz_topics()) <= published and EXPECTED_SERVICES | action_services <= services:
                break
            time.sleep(0.5)
        published = {t for t in topics if probe.node.count_publishers(t) > 0}
        yield published, services
    finally:
        probe.close()
        process.send_signal(2)
        code = process.wait(timeout=30)
        log.close()
        assert code == 0, (work / "bringup.log").read_text()


def test_every_expected_topic_and_service_is_up(graph):
    published, services = graph
    assert EXPECTED_TOPICS <= published, EXPECTED_TOPICS - published
    assert EXPECTED_SERVICES <= services, EXPECTED_SERVICES - services


def test_every_action_server_is_up(graph):
    _, services = graph
    missing = {a for a in EXPECTED_ACTIONS if f"{a}/_action/send_goal" not in services}
    assert not missing


def test_everything_rviz_shows_is_published(graph):
    published, _ = graph
    assert _rviz_topics() <= published, _rviz_topics() - published
