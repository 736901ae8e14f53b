"""The box tracker's noise and latency, measured from a recording of the cell.

Pure Python (numpy; the bag through twinloop_logging's reader; no rclpy). A bag that holds
the tracker's poses (`/twinloop/perception/box_pose`, e.g. any identification or trial
session) tells how the policy will see the box: the noise is the spread of successive
positions while the box rests (pairs that moved less than `rest_step_m` on each axis; a
robust spread of their differences, / sqrt(2) for the pair; the policy runner's
`judge_settle_m`, 3 mm in x-y, is the stricter rule that ends a trial on a box at rest),
the latency is the median of the recorder's receive time minus the pose's stamp (the
camera frame it came from). Training then draws
the tracker's view with these instead of config/policy_task.yaml's stated values.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twinloop_logging.bag_reader import open_bag, stamp_ns
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC

MIN_REST_PAIRS = 20


class ObservationModelError(ValueError):
    """The bag cannot give the tracker's noise and latency; the message says why."""


@dataclass(frozen=True)
class TrackerModel:
    position_std_m: float  # per axis in xy, from successive poses at rest
    latency_s: float  # median receive time - stamp
    reported_std_m: float  # median 1-sigma the tracker's own covariance gives (xy)
    poses: int
    rest_pairs: int
    source: str

    def to_dict(self) -> dict:
        return {"source": self.source, "position_std_m": round(self.position_std_m, 6),
                "latency_s": round(self.latency_s, 4), "reported_std_m": round(self.reported_std_m, 6),
                "poses": self.poses, "rest_pairs": self.rest_pairs}


def tracker_model(bag_path: Path | str, *, topic: str = TRACKED_BOX_POSE_TOPIC,
                  rest_step_m: float = 0.004) -> TrackerModel:
    with open_bag(bag_path) as bag:
        if topic not in {t.name for t in bag.topics.values()}:
            raise ObservationModelError(f"{bag_path} has no {topic}: record a session while the box tracker runs "
                                        "(its poses are part of the identification and trial profiles)")
        rows = []
        for m in bag.messages([topic]):
            p = m.msg.pose.pose.position
            c = np.asarray(m.msg.pose.covariance, dtype=float).reshape(6, 6)
            rows.append((stamp_ns(m.msg), m.log_time_ns, p.x, p.y, c[0, 0], c[1, 1]))
    if len(rows) < MIN_REST_PAIRS + 1:
        raise ObservationModelError(f"{bag_path} holds {len(rows)} poses on {topic}; at least "
                                    f"{MIN_REST_PAIRS + 1} are needed")
    data = np.array(rows, dtype=float)
    data = data[np.argsort(data[:, 0])]
    steps = np.diff(data[:, 2:4], axis=0)
    rest = np.all(np.abs(steps) < rest_step_m, axis=1)
    if rest.sum() < MIN_REST_PAIRS:
        raise ObservationModelError(f"{bag_path}: only {int(rest.sum())} successive poses of the box at rest "
                                    f"(moved < {rest_step_m * 1e3:.0f} mm); record a while with the box still")
    differences = steps[rest]
    mad = np.median(np.abs(differences - np.median(differences, axis=0)), axis=0)
    std = float(np.mean(1.4826 * mad / np.sqrt(2.0)))
    latency = float(np.median(data[:, 1] - data[:, 0])) * 1e-9
    reported = float(np.median(np.sqrt(0.5 * (data[:, 4] + data[:, 5]))))
    return TrackerModel(position_std_m=std, latency_s=max(latency, 0.0), reported_std_m=reported, poses=len(data),
                        rest_pairs=int(rest.sum()), source=str(bag_path))
