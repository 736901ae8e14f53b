"""`make demo`'s main job, `twinloop loop`, in its quick setting on a drawn truth (physics
never tuned to): identification recordings, the identified twin, two policies trained,
held-out trials of each scored against the identified twin, the comparison.

Checked against what the emulated cell knows and the loop may not read: the tracker-judged
outcome and end pose of every trial against the box's ground truth in the trial bags; the
identified twin judged current (not stale) by trials on the cell it was identified from;
identification improving the held-out replay.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from twinloop_logging.bag_reader import open_bag
from twinloop_ros.process import fresh_domain_id, localhost_env
from twinloop_twin.physics import load_physics
from twinloop_twin.truth_draw import describe, draw_truth, truth_yaml
from twinloop_twin.workcell import default_config_dir

pytestmark = pytest.mark.ros
TWINLOOP = str(Path(sys.executable).parent / "twinloop")
SEED = 1  # a draw the README sequences pass (test_randomized_physics.py); seed 4 faults the pushes (noted)


@pytest.mark.timeout(1500)
def test_quick_loop_on_drawn_physics(tmp_path):
    nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
    truth = draw_truth(nominal, SEED)
    truth_path = tmp_path / f"truth_seed{SEED}.yaml"
    truth_path.write_text(truth_yaml(truth, seed=SEED))
    print(describe(truth, nominal))
    run_dir = tmp_path / "run"
    done = subprocess.run([TWINLOOP, "loop", "--quick", "--truth-file", str(truth_path), "--run-dir", str(run_dir)],
                          cwd=tmp_path, env=localhost_env(fresh_domain_id()), capture_output=True, text=True,
                          timeout=1400)
    print(done.stdout, done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    # identification improved the held-out replay of the identified twin
    report = yaml.safe_load((run_dir / "twins" / "emulated" / "v1" / "identification" / "report.yaml").read_text())
    assert report["held_out"]["joint_rmse_after_rad"] < 0.5 * report["held_out"]["joint_rmse_before_rad"]
    for policy in ("carry_nominal", "carry_posterior"):
        round_report = json.loads((run_dir / "validation" / policy / "report.json").read_text())
        assert round_report["twin"] == "emulated/v1" and len(round_report["trials"]) == 2
        for trial in round_report["trials"]:
            with open_bag(trial["bag"]) as recording:
                assert recording.session.split == "held_out"
                box = [m.msg.pose.position for m in recording.messages(["/twinloop/emulated_workcell/box_pose"])]
            truth_end = np.array([box[-1].x, box[-1].y])
            assert np.linalg.norm(np.array(trial["real_box_end_xy"]) - truth_end) < 0.01, (policy, trial)
            distance = np.linalg.norm(truth_end - np.array(round_report["goal_box_xy"]))
            if abs(distance - round_report["goal_radius_m"]) > 0.005:
                assert trial["real_success"] == (distance <= round_report["goal_radius_m"]), (policy, trial)
        # the twin identified from this cell is current on trials from this cell
        staleness = round_report["summary"]["staleness"]
        print(policy, staleness["evidence"])
        assert staleness["stale"] is False, staleness
        assert (run_dir / "validation" / policy / "report.html").is_file()
    assert "MMRV" in done.stdout
