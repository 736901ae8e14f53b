"""The newest twin version's standing (twinloop_twin.status) as ROS messages: a
diagnostic_msgs/DiagnosticStatus for /diagnostics (OK current or not checked, WARN stale,
with the evidence) and a text marker for RViz above the table (green current, red STALE,
grey not checked). Message building only: no node here; the twin builder publishes them.
"""
from __future__ import annotations

from pathlib import Path

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from twinloop_twin.bundle import TwinError, latest_version
from twinloop_twin.status import Verdict, describe, load_verdicts

WORLD_FRAME = "world"
TEXT_AT = (0.5, 0.0, 1.35)  # m, world: above the table, where the default RViz view looks
COLORS = {"current": (0.2, 0.8, 0.2, 1.0), "stale": (0.95, 0.15, 0.1, 1.0), None: (0.7, 0.7, 0.7, 1.0)}


def newest_standing(root: Path | str, workcell: str) -> tuple[int | None, Verdict | None, str]:
    """(newest version or None, its verdict or None, a problem reading the status file or '')."""
    version = latest_version(root, workcell)
    if version is None:
        return None, None, ""
    try:
        return version, load_verdicts(root, workcell).get(version), ""
    except TwinError as error:
        return version, None, str(error)


def diagnostic(workcell: str, version: int | None, verdict: Verdict | None, problem: str = "") -> DiagnosticStatus:
    status = DiagnosticStatus(name=f"twinloop twin {workcell}", hardware_id=workcell)
    if version is None:
        status.level, status.message = DiagnosticStatus.OK, "no twin version yet"
        return status
    status.level = DiagnosticStatus.WARN if (verdict is not None and verdict.stale) or problem else DiagnosticStatus.OK
    status.message = f"v{version} " + (problem or describe(verdict))
    status.values = [KeyValue(key="version", value=str(version)),
                     KeyValue(key="state", value=verdict.state if verdict else "not checked"),
                     KeyValue(key="round", value=verdict.round if verdict else ""),
                     KeyValue(key="checked_at", value=verdict.checked_at if verdict else "")]
    return status


def status_marker(workcell: str, version: int | None, verdict: Verdict | None) -> MarkerArray:
    marker = Marker(ns="twin_status", id=0, type=Marker.TEXT_VIEW_FACING, action=Marker.ADD)
    marker.header.frame_id = WORLD_FRAME
    marker.pose.position.x, marker.pose.position.y, marker.pose.position.z = TEXT_AT
    marker.pose.orientation.w = 1.0
    marker.scale.z = 0.06
    state = verdict.state if verdict else None
    marker.color = ColorRGBA(**dict(zip("rgba", COLORS[state])))
    marker.text = (f"twin {workcell}: none yet" if version is None else
                   f"twin {workcell} v{version}: " + ("STALE" if state == "stale" else state or "not checked"))
    return MarkerArray(markers=[marker])
