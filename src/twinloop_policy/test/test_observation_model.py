"""The box tracker's noise and latency measured from a recording (observation_model.py) on a
bag of known noise and latency; `twinloop policy train --tracker-bag` trains with them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from twinloop_logging.bag_writer import BagWriter
from twinloop_logging.typedefs import TypeResolver
from twinloop_policy.observation_model import ObservationModelError, tracker_model
from twinloop_policy.policy_spec import load_policy_spec
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC

STORE = get_typestore(Stores.ROS2_KILTED)
POSE = "geometry_msgs/msg/PoseWithCovarianceStamped"
T0 = 1_800_000_000_000_000_000


def write_tracker_bag(path: Path, *, std_m: float, latency_s: float, seed: int = 0) -> Path:
    """15 Hz poses: 150 at rest, 20 while the box is carried 15 cm, 150 at rest again."""
    rng = np.random.default_rng(seed)
    t = STORE.types
    writer = BagWriter(path)
    writer.add_topic(TRACKED_BOX_POSE_TOPIC, TypeResolver().definition(POSE))
    places = [np.array([0.45, -0.2])] * 150 + [np.array([0.45, -0.2 + 0.0075 * k]) for k in range(1, 21)]
    places += [np.array([0.45, -0.05])] * 150
    for i, place in enumerate(places):
        stamp = T0 + int(i / 15.0 * 1e9)
        xy = place + rng.normal(0.0, std_m, 2)
        covariance = np.zeros(36)
        covariance[0] = covariance[7] = covariance[14] = (1.2 * std_m) ** 2
        msg = t[POSE](header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](
            sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id="world"),
            pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=t["geometry_msgs/msg/Pose"](
                position=t["geometry_msgs/msg/Point"](x=xy[0], y=xy[1], z=0.78),
                orientation=t["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)), covariance=covariance))
        receive = stamp + int((latency_s + rng.uniform(-0.005, 0.005)) * 1e9)
        writer.write(TRACKED_BOX_POSE_TOPIC, bytes(STORE.serialize_cdr(msg, POSE)), receive)
    writer.close()
    return path


def test_noise_and_latency_from_a_bag_of_known_ones(tmp_path):
    bag = write_tracker_bag(tmp_path / "session", std_m=0.0007, latency_s=0.041)
    model = tracker_model(bag)
    print(f"measured {model.position_std_m * 1e3:.3f} mm (written 0.700), latency {model.latency_s * 1e3:.1f} ms "
          f"(written 41), {model.rest_pairs} pairs at rest")
    # ~300 pairs at rest: a robust spread within 12 %; the carry's 7.5 mm steps are not rest
    assert model.position_std_m == pytest.approx(0.0007, rel=0.12)
    assert model.latency_s == pytest.approx(0.041, abs=0.002)
    assert model.reported_std_m == pytest.approx(0.00084, rel=0.01)
    assert 285 <= model.rest_pairs <= 300  # 299 pairs within a place (the carry ends on the second); noise pushes few past 4 mm


def test_a_bag_without_the_tracker_is_refused(tmp_path):
    from twinloop_logging.bag_writer import BagWriter as Writer
    writer = Writer(tmp_path / "joints")
    writer.add_topic("/joint_states", TypeResolver().definition("sensor_msgs/msg/JointState"))
    writer.close()
    with pytest.raises(ObservationModelError, match="has no /twinloop/perception/box_pose"):
        tracker_model(tmp_path / "joints")


def test_train_uses_the_measured_tracker(tmp_path):
    bag = write_tracker_bag(tmp_path / "session", std_m=0.001, latency_s=0.05)
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(
        ["bash", "-c", f"twinloop policy train carry --mode nominal --tracker-bag {bag} --contexts 1 --draws 1 "
                       "--iterations 1 --episodes 2"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "box tracker from" in done.stdout and "latency 50 ms" in done.stdout, done.stdout
    spec = load_policy_spec(tmp_path / "carry")
    measured = spec.training["tracker_model"]["position_std_m"]
    assert spec.randomization["tracker_position_std_m"] == pytest.approx(measured, rel=1e-3)
    assert measured == pytest.approx(0.001, rel=0.15)
    wrong = subprocess.run(
        ["bash", "-c", "twinloop policy train other --mode nominal --tracker-bag no_such_bag"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert not (tmp_path / "other").exists()
