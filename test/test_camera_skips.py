"""Camera frames the source skipped are reported, by the workcell's status and by the recorder.

The emulated cameras are declared at 60 Hz, faster than a CPU renders two RGB-D cameras,
so the camera process skips frames. Every frame is stamped on the physics clock: over the
recorded span, frames received + skipped + dropped must add up to the declared periods in
it (each gap is rounded to whole periods, so to within half a period per gap), in the
recorder's accounting (live status and the bag's metadata), and the workcell's status must
report the same rate and at least the same skips (it counts from its first frame).
"""
from __future__ import annotations

import time

import pytest
from twinloop_interfaces.msg import SessionId, SystemStatus

from twinloop_logging.bag_reader import open_bag
from twinloop_ros.clients import RecorderClient
from twinloop_ros.qos import LATCHED
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.workcell import default_config_dir

pytestmark = pytest.mark.ros

DECLARED_HZ = 60.0
TOPIC = "/wrist_camera/color/image_raw"


def test_skipped_frames_in_the_workcell_status_and_the_recording(tmp_path):
    domain = fresh_domain_id()
    config = default_config_dir()
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"camera_rate_hz": DECLARED_HZ},
                           log_path=tmp_path / "workcell.log",
                           extra_args=["--params-file", str(config / "emulated_workcell.yaml")])
    recorder = NodeProcess("twinloop_logging.recorder_node", domain,
                           {"output_dir": str(tmp_path), "declared_rates": f"['/wrist_camera/.*={DECLARED_HZ}']"},
                           log_path=tmp_path / "recorder.log",
                           extra_args=["--params-file", str(config / "recorder.yaml")])
    probe = RosProbe(domain)
    try:
        status = probe.collect(SystemStatus, "/emulated_workcell/status", LATCHED)
        client = RecorderClient(probe.node)
        client.wait_for_recorder(timeout_s=60.0)
        bag = client.start(profile="calibration", purpose=SessionId.PURPOSE_CALIBRATION, split=SessionId.SPLIT_FIT)
        client.wait_until_recording(bag, (TOPIC,), timeout_s=60.0)
        time.sleep(6.0)
        client.stop()
        live = next(t for t in client.status.topics if t.topic == TOPIC)
        # The workcell counts from the cameras' first frame, and its status trails by up to two
        # 1 s periods (camera process, then workcell): wait until it has seen the recorded span.
        skipped_in_bag = live.source_skipped - live.dropped_estimate
        probe.wait_for(lambda: status and int(_values(status[-1][1]).get("camera_frames_skipped", -1)) >=
                       skipped_in_bag, 10.0, f"the workcell status counting >= {skipped_in_bag} skipped frames")
        workcell_values, level, message = _values(status[-1][1]), status[-1][1].level, status[-1][1].message
    finally:
        probe.close()
        recorder.stop()
        workcell.stop()
    with open_bag(bag) as reader:
        stats = reader.topic_stats[TOPIC]
        stamps = reader.images(TOPIC).stamps_ns
    periods = round((stamps[-1] - stamps[0]) * DECLARED_HZ / 1e9) + 1
    delivered_hz = (len(stamps) - 1) * 1e9 / (stamps[-1] - stamps[0])
    print(f"{TOPIC}: {stats['received']} received, {stats['source_skipped']} skipped at the source, "
          f"{stats['dropped_estimate']} dropped over {periods} declared periods ({delivered_hz:.1f} of "
          f"{DECLARED_HZ:.0f} Hz); workcell status: {workcell_values}")
    # Every declared period of the recorded span is a frame received, skipped or dropped.
    accounted = stats["received"] + stats["source_skipped"] + stats["dropped_estimate"]
    assert abs(accounted - periods) <= 0.5 * (len(stamps) - 1) + 1, (accounted, periods)
    assert stats["source_skipped"] > 0.5 * periods - stats["received"]  # not the stream's own period
    assert stats["received"] == len(stamps) and stats["declared_rate_hz"] == DECLARED_HZ
    assert (live.received, live.source_skipped) == (stats["received"], stats["source_skipped"])
    # The workcell says what the cameras delivered, on the same stamps (its window is the last 5 s).
    assert float(workcell_values["camera_rate_hz_declared"]) == DECLARED_HZ
    assert float(workcell_values["camera_rate_hz_delivered"]) == pytest.approx(delivered_hz, rel=0.3)
    if delivered_hz < 0.9 * DECLARED_HZ:
        assert level == SystemStatus.LEVEL_WARN and "frames skipped" in message, message


def _values(msg: SystemStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in msg.values}
