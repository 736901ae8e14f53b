"""The envelope's boxes as RViz markers, coloured by the monitor's state. Needs only messages."""
from __future__ import annotations

from builtin_interfaces.msg import Time
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from twinloop_safety.envelope import Box, EnvelopeLimits, State

FRAME = "world"
WORKSPACE_COLOR = {State.DISARMED: (0.6, 0.6, 0.6, 0.08), State.ARMED: (0.1, 0.8, 0.2, 0.08),
                   State.FAULT: (0.9, 0.1, 0.1, 0.15)}
KEEP_OUT_COLOR = {State.DISARMED: (0.5, 0.3, 0.1, 0.35), State.ARMED: (1.0, 0.5, 0.0, 0.35),
                  State.FAULT: (0.9, 0.1, 0.1, 0.5)}


def _cube(box: Box, marker_id: int, namespace: str, rgba: tuple, stamp: Time) -> Marker:
    marker = Marker(ns=namespace, id=marker_id, type=Marker.CUBE, action=Marker.ADD)
    marker.header.frame_id = FRAME
    marker.header.stamp = stamp
    marker.pose.position.x, marker.pose.position.y, marker.pose.position.z = box.center
    marker.pose.orientation.w = 1.0
    marker.scale.x, marker.scale.y, marker.scale.z = box.size
    marker.color = ColorRGBA(r=rgba[0], g=rgba[1], b=rgba[2], a=rgba[3])
    marker.text = box.name
    return marker


def envelope_markers(limits: EnvelopeLimits, state: State, stamp: Time) -> MarkerArray:
    """Workspace box (id 0, ns 'workspace') and keep-out boxes (ids 0.., ns 'keep_out')."""
    markers = [_cube(limits.workspace, 0, "workspace", WORKSPACE_COLOR[state], stamp)]
    markers += [_cube(box, i, "keep_out", KEEP_OUT_COLOR[state], stamp) for i, box in enumerate(limits.keep_out)]
    return MarkerArray(markers=markers)
