"""Calibration from a recorded bag, as the calibration README runs it, on the emulated workcell.

A calibration session is recorded (the recorder's `calibration` profile) while the
calibration server drives the arm through its planned views (the shipped parameter files,
commanding /joint_command directly as on a cell without a monitor: what is tested here is
the bag, and test_calibration_server.py runs the live path through the monitor); then the
same camera is calibrated from that bag, with
`twinloop calibrate --bag BAG --camera wrist_camera --setup eye_in_hand` and with the
action (`source: bag`). All three results are compared with the wrist camera's mount in
the URDF (the truth here).
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from twinloop_interfaces.msg import SessionId

from twinloop_calibration import se3
from twinloop_calibration.calibration_io import load_calibration
from twinloop_ros.clients import CalibrationClient, ClientError, RecorderClient
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id, localhost_env
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import default_config_dir, load_workcell

pytestmark = pytest.mark.ros

TWINLOOP = str(Path(sys.executable).parent / "twinloop")
CAMERA = "wrist_camera"
# test_calibration_server.py's tolerance for a wrist calibration at this noise, for the
# calibrations from the bag (every frame at rest in the bag).
TOLERANCE_M, TOLERANCE_DEG = 0.5e-3, 0.1
# The live run here plans 8 views and may keep only 5 of them on a loaded host (a pose that
# misses its settle deadline is skipped); with 6 views it was 0.52 mm off once, so its bound
# is wider than the bag's.
LIVE_TOLERANCE_M, LIVE_TOLERANCE_DEG = 0.8e-3, 0.15


def _hand_T_wrist():
    workcell = load_workcell()
    kinematics = UrdfTransforms(workcell.urdf_xml)
    home = workcell.home_joint_positions
    return (se3.inv(kinematics.world_T_link("panda_hand", home))
            @ kinematics.world_T_link(f"{CAMERA}_color_optical_frame", home))


def _errors(estimate) -> tuple[float, float]:
    translation_m, rotation_rad = se3.errors(estimate, _hand_T_wrist())
    return translation_m, math.degrees(rotation_rad)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A calibration bag recorded during a live calibration: (bag path, live result, probe, domain, folder)."""
    folder = tmp_path_factory.mktemp("calibration_bag")
    domain = fresh_domain_id()
    config = default_config_dir()
    nodes = [
        NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"seed": 3}, log_path=folder / "workcell.log",
                    extra_args=["--params-file", str(config / "emulated_workcell.yaml")]),
        NodeProcess("twinloop_logging.recorder_node", domain, {"output_dir": str(folder / "bags")},
                    log_path=folder / "recorder.log", extra_args=["--params-file", str(config / "recorder.yaml")]),
        NodeProcess("twinloop_calibration.calibration_server_node", domain,
                    {"calibration_root": str(folder / "live"), "bootstrap": 10, "monitor_node": "''",
                     "command_topic": "/joint_command"},
                    log_path=folder / "server.log", extra_args=["--params-file", str(config / "calibration.yaml")]),
    ]
    probe = RosProbe(domain)
    try:
        recorder, calibration = RecorderClient(probe.node), CalibrationClient(probe.node)
        recorder.wait_for_recorder(timeout_s=60.0)
        bag = recorder.start(profile="calibration", purpose=SessionId.PURPOSE_CALIBRATION, split=SessionId.SPLIT_FIT,
                             note="wrist camera, planned views")
        recorder.wait_until_recording(bag, ("/joint_states", f"/{CAMERA}/color/image_raw",
                                            f"/{CAMERA}/color/camera_info"), timeout_s=60.0)
        try:
            # 8 planned, 5 needed: on a loaded host a pose can miss its settle deadline and be skipped.
            live = calibration.live(CAMERA, "eye_in_hand", num_views=8, timeout_s=300.0)
        except ClientError as error:
            raise AssertionError(f"{error}\n" + "".join(n.log()[-1500:] for n in nodes)) from error
        finally:
            recorder.stop()
        yield Path(bag), live, probe, calibration, folder
    finally:
        probe.close()
        for node in reversed(nodes):
            node.stop()


def test_live_run_recorded_a_calibration_bag(recorded):
    bag, live, *_ = recorded
    estimate, _ = load_calibration(live.calibration_path)
    translation_m, rotation_deg = _errors(estimate)
    print(f"live: {translation_m * 1e3:.2f} mm, {rotation_deg:.3f} deg from the URDF mount ({live.views_used} views)")
    assert translation_m < LIVE_TOLERANCE_M and rotation_deg < LIVE_TOLERANCE_DEG
    from twinloop_logging.bag_reader import open_bag
    with open_bag(bag) as reader:
        assert reader.session.purpose == SessionId.PURPOSE_CALIBRATION
        stats = reader.topic_stats[f"/{CAMERA}/color/image_raw"]
        seconds = (reader.end_ns - reader.start_ns) * 1e-9
        print(f"{stats['received']} wrist images in {seconds:.0f} s ({stats['source_skipped']} skipped by the "
              f"camera against its declared 15 Hz, {stats['dropped_estimate']} dropped)")
        assert stats["received"] == reader.topics[f"/{CAMERA}/color/image_raw"].count > 30
        assert {"/joint_states", f"/{CAMERA}/color/camera_info", "/tf_static"} <= set(reader.topics)


def test_cli_calibrates_from_the_bag(recorded):
    bag, _, _, _, folder = recorded
    output = folder / "from_bag.yaml"
    # The README's command; 10 bootstrap resamples as the server's (30 by default: minutes on 2 cores).
    done = subprocess.run([TWINLOOP, "calibrate", "--bag", str(bag), "--camera", CAMERA, "--setup", "eye_in_hand",
                           "--output", str(output), "--bootstrap", "10"], env=localhost_env(fresh_domain_id()),
                          capture_output=True, text=True, timeout=300)
    print(done.stdout[-2500:], done.stderr[-1500:])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    estimate, document = load_calibration(output)
    translation_m, rotation_deg = _errors(estimate)
    print(f"twinloop calibrate --bag: {translation_m * 1e3:.2f} mm, {rotation_deg:.3f} deg from the URDF mount")
    assert translation_m < TOLERANCE_M and rotation_deg < TOLERANCE_DEG
    assert document["source"]["mode"] == "bag"


def test_action_calibrates_from_the_bag(recorded):
    bag, _, _, calibration, _ = recorded
    result = calibration.from_bag(str(bag), CAMERA, "eye_in_hand", timeout_s=300.0)  # ClientError on failure
    estimate, document = load_calibration(result.calibration_path)
    translation_m, rotation_deg = _errors(estimate)
    print(f"action, source bag: {translation_m * 1e3:.2f} mm, {rotation_deg:.3f} deg from the URDF mount, "
          f"{result.views_used} views")
    assert translation_m < TOLERANCE_M and rotation_deg < TOLERANCE_DEG
    assert document["source"]["mode"] == "bag" and document["source"]["bag"] == str(bag)
