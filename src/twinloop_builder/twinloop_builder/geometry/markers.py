"""A twin version's measured geometry as RViz markers (visualization_msgs/MarkerArray).

The fused scan surface (decimated, its own colors) and each scanned object's visual mesh
at its measured pose, in the world frame; the twin builder publishes them latched.
Message building only: no node here.
"""
from __future__ import annotations

import numpy as np
import open3d as o3d
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from twinloop_twin.bundle import TwinBundle
from twinloop_twin.nominal import twin_geometry

from twinloop_builder.geometry.assembly import SURFACE_FILE

WORLD_FRAME = "world"
OBJECT_COLOR = (0.45, 0.55, 0.7, 0.9)


def geometry_markers(twin: TwinBundle, *, max_surface_triangles: int = 20000) -> MarkerArray:
    """Markers of the twin's scan surface and scanned objects; an array that deletes the
    previous ones first, so a twin without geometry clears the display."""
    markers = [Marker(action=Marker.DELETEALL)]
    if SURFACE_FILE in twin.manifest.files:
        mesh = o3d.io.read_triangle_mesh(str(twin.file_path(SURFACE_FILE)))
        if len(mesh.triangles) > max_surface_triangles:
            mesh = mesh.simplify_quadric_decimation(max_surface_triangles)
        colors = np.asarray(mesh.vertex_colors) if mesh.has_vertex_colors() else None
        markers.append(_triangles("scan_surface", 0, np.asarray(mesh.vertices), np.asarray(mesh.triangles), colors,
                                  f"twin v{twin.version} scan surface"))
    layer = twin_geometry(twin)
    for index, obj in enumerate(layer.objects if layer else ()):
        if not obj.visual_triangles:
            marker = Marker(ns="scanned_objects", id=index, type=Marker.CUBE)
            marker.scale.x, marker.scale.y, marker.scale.z = obj.size_m
        else:
            marker = _triangles("scanned_objects", index, np.array(obj.visual_vertices), np.array(obj.visual_triangles),
                                None, obj.name)
        marker.header.frame_id = WORLD_FRAME
        marker.color = ColorRGBA(r=OBJECT_COLOR[0], g=OBJECT_COLOR[1], b=OBJECT_COLOR[2], a=OBJECT_COLOR[3])
        p, q = marker.pose.position, marker.pose.orientation
        p.x, p.y, p.z = obj.position_m
        q.w, q.x, q.y, q.z = obj.quat_wxyz
        markers.append(marker)
    return MarkerArray(markers=markers)


def _triangles(namespace: str, index: int, vertices: np.ndarray, triangles: np.ndarray, colors: np.ndarray | None,
               text: str) -> Marker:
    marker = Marker(ns=namespace, id=index, type=Marker.TRIANGLE_LIST, action=Marker.ADD, text=text)
    marker.header.frame_id = WORLD_FRAME
    marker.pose.orientation.w = 1.0
    marker.scale.x = marker.scale.y = marker.scale.z = 1.0
    marker.color = ColorRGBA(r=0.8, g=0.8, b=0.8, a=1.0)
    corners = vertices[triangles.ravel()]
    marker.points = [Point(x=float(x), y=float(y), z=float(z)) for x, y, z in corners]
    if colors is not None:
        marker.colors = [ColorRGBA(r=float(r), g=float(g), b=float(b), a=1.0) for r, g, b in colors[triangles.ravel()]]
    return marker
