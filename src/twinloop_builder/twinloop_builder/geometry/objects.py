"""A fused surface split into the table's plane and the objects resting on it.

Open3D finds the plane (RANSAC) and the clusters (DBSCAN); each object is then described
the way a collision model needs it: its footprint's minimum-area rectangle on the plane
(OpenCV) and its height above the plane give a box, its pose (yaw about the plane's
normal) and size, in the fusion's world frame. Objects too small to be more than noise
(fewer points, or thinner than `min_height_m`) are left out and counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import cv2
import numpy as np
import open3d as o3d


class SegmentationError(ValueError):
    """No table, or nothing on it; the message says what was seen."""


@dataclass(frozen=True)
class SegmentationSettings:
    plane_distance_m: float = 0.004  # m, RANSAC inlier distance of the table plane
    min_height_m: float = 0.004  # m, points nearer the plane than this are the table
    max_height_m: float = 0.5  # m, higher points are not objects on the table (the robot)
    # m, an object rests on the table: its lowest points (1st percentile) are this near it. A
    # wall seen only at grazing angles fuses partway down: a 5 cm bracket seen from above
    # had its lowest 1 % at 18 mm; the hand above the table during a scan is far higher.
    max_base_height_m: float = 0.03
    cluster_distance_m: float = 0.01  # m, DBSCAN eps
    min_points: int = 50  # a cluster with fewer points is noise
    region_xy_m: tuple[tuple[float, float], tuple[float, float]] | None = None  # ((xmin, xmax), (ymin, ymax))
    # the described table height: the plane is sought among points within table_band_m of it
    # (a wrist camera sees the floor too, a larger plane)
    table_height_m: float | None = None  # m, world z
    table_band_m: float = 0.1  # m


@dataclass
class TableObject:
    world_T_object: np.ndarray  # 4x4: centre of the box, z along the table's normal
    size_m: np.ndarray  # (3,) extents along the object's x, y, z
    points: np.ndarray = field(repr=False)  # (N, 3) its surface points

    @property
    def height_m(self) -> float:
        return float(self.size_m[2])


@dataclass
class Segmentation:
    plane: np.ndarray  # (4,) a, b, c, d with (a, b, c) the unit normal pointing up
    table_points: np.ndarray  # (N, 3)
    objects: list[TableObject]
    dropped_clusters: int


def segment_table(points: np.ndarray, settings: SegmentationSettings = SegmentationSettings()) -> Segmentation:
    """The dominant horizontal plane and the clusters above it, from surface points (a fused
    mesh's vertices: marching cubes leaves about one per voxel of surface)."""
    near_table = points if settings.table_height_m is None else \
        points[np.abs(points[:, 2] - settings.table_height_m) < settings.table_band_m]
    if len(near_table) < 100:
        raise SegmentationError(f"{len(near_table)} surface points within {settings.table_band_m} m of the described "
                                f"table height {settings.table_height_m} m: the scan does not show the table")
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(near_table))
    o3d.utility.random.seed(0)
    plane, inliers = cloud.segment_plane(settings.plane_distance_m, 3, 1000)
    plane = np.asarray(plane, float)
    plane /= np.linalg.norm(plane[:3])
    if plane[2] < 0:
        plane = -plane
    if plane[2] < math.cos(math.radians(20)):
        raise SegmentationError(f"the largest plane's normal {plane[:3].round(3).tolist()} is more than 20 deg off "
                                "vertical: no table in view, or the camera poses are not in a z-up world frame")
    height = points @ plane[:3] + plane[3]
    above = (height > settings.min_height_m) & (height < settings.max_height_m)
    if settings.region_xy_m is not None:
        (x0, x1), (y0, y1) = settings.region_xy_m
        above &= (points[:, 0] > x0) & (points[:, 0] < x1) & (points[:, 1] > y0) & (points[:, 1] < y1)
    candidates = points[above]
    objects, dropped = [], 0
    if len(candidates):
        labels = np.asarray(o3d.geometry.PointCloud(o3d.utility.Vector3dVector(candidates)).cluster_dbscan(
            settings.cluster_distance_m, 10))
        for label in sorted(set(labels.tolist()) - {-1}):
            members = candidates[labels == label]
            lowest = float(np.percentile(members @ plane[:3] + plane[3], 1))
            if len(members) < settings.min_points or lowest > settings.max_base_height_m:
                dropped += 1
                continue
            objects.append(_box_on_plane(members, plane))
    objects.sort(key=lambda o: -len(o.points))
    return Segmentation(plane, points[np.abs(height) <= settings.plane_distance_m], objects, dropped)


def _box_on_plane(points: np.ndarray, plane: np.ndarray) -> TableObject:
    """The box standing on the plane that holds the points: footprint rectangle x height."""
    normal = plane[:3]
    x_axis = np.cross([0.0, 1.0, 0.0], normal)
    x_axis /= np.linalg.norm(x_axis)
    y_axis = np.cross(normal, x_axis)
    height = points @ normal + plane[3]
    # the top: the median of the highest 5 mm band (a noisy surface's maximum stands proud)
    highest = float(np.percentile(height, 99.5))
    top = float(np.median(height[height > highest - 0.005]))
    # the footprint from the top face where it has one (every view above sees it squarely);
    # sides seen at grazing angles came out up to 4 mm proud, and the TSDF rounds the foot of
    # an object into the table by about its truncation distance
    upper = points[height > top - 0.005]
    if len(upper) < 30:
        upper = points[height > 0.4 * top]
    uv = np.column_stack([upper @ x_axis, upper @ y_axis])
    _, _, angle_deg = cv2.minAreaRect((uv * 1e4).astype(np.float32))  # 0.1 mm units: its orientation
    angle = math.radians(angle_deg)
    ox = math.cos(angle) * x_axis + math.sin(angle) * y_axis
    oy = np.cross(normal, ox)
    # extents from the 0.5-99.5 % range along each side: a few stray vertices at a grazing
    # view's edge would otherwise set the rectangle (seen: one side 7.5 mm long)
    along = np.column_stack([upper @ ox, upper @ oy])
    low, high = np.percentile(along, 0.5, axis=0), np.percentile(along, 99.5, axis=0)
    centre_uv = (low + high) / 2.0
    centre_on_plane = centre_uv[0] * ox + centre_uv[1] * oy - plane[3] * normal
    pose = np.eye(4)
    pose[:3, :3] = np.column_stack([ox, oy, normal])
    pose[:3, 3] = centre_on_plane + normal * top / 2.0
    w, h = high - low
    return TableObject(pose, np.array([w, h, top]), points)
