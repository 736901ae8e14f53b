"""TSDF fusion of posed RGB-D frames with Open3D's VoxelBlockGrid, and a colored mesh out.

Open3D does the integration and the marching cubes; what is here is the frame checks
(a frame that cannot contribute says why) and the bookkeeping. `ScalableTSDFVolume`
(the legacy API) returns empty meshes in Open3D 0.20, hence the tensor VoxelBlockGrid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import open3d as o3d
import open3d.core as o3c


class FusionError(ValueError):
    """Frames that cannot be fused; the message says which and what to do. `code`: the
    twinloop_interfaces/ErrorCode name a node answers with."""

    code = "INVALID_ARGUMENT"


class ScanBagNotFound(FusionError, FileNotFoundError):
    code = "FILE_NOT_FOUND"


@dataclass(frozen=True)
class PosedFrame:
    color: np.ndarray  # HxWx3 uint8 RGB
    depth_mm: np.ndarray  # HxW uint16, mm along the optical axis (0: no return), aligned to color
    camera_matrix: np.ndarray  # 3x3 pinhole K of both images
    world_T_camera: np.ndarray  # 4x4, the optical frame in the fusion's world frame
    name: str = ""


@dataclass(frozen=True)
class FusionSettings:
    voxel_size_m: float = 0.004  # m
    truncation_voxels: float = 3.0  # the TSDF's truncation, in voxels (8 rounded a 6 cm box into 7.5 cm)
    depth_max_m: float = 2.0  # m, farther returns are left out
    min_weight: float = 1.0  # a surface voxel needs at least this many frames' weight
    block_count: int = 4000  # initial hash map capacity (16^3-voxel blocks; it grows as needed, and 40 000 preallocated 3.3 GB)


@dataclass
class FusedSurface:
    vertices: np.ndarray  # (V, 3) m, world
    triangles: np.ndarray  # (T, 3) vertex indices
    colors: np.ndarray  # (V, 3) 0-1 RGB
    frames_used: int

    def to_open3d(self) -> o3d.geometry.TriangleMesh:
        mesh = o3d.geometry.TriangleMesh(o3d.utility.Vector3dVector(self.vertices),
                                         o3d.utility.Vector3iVector(self.triangles))
        mesh.vertex_colors = o3d.utility.Vector3dVector(self.colors)
        return mesh


def check_frame(frame: PosedFrame, settings: FusionSettings) -> None:
    label = frame.name or "a frame"
    if frame.depth_mm.ndim != 2 or frame.color.shape[:2] != frame.depth_mm.shape:
        raise FusionError(f"{label}: color {frame.color.shape} and depth {frame.depth_mm.shape} are not one aligned "
                          "pair (depth must be aligned to color, as realsense-ros align_depth gives it)")
    k = np.asarray(frame.camera_matrix, float)
    if k.shape != (3, 3) or not np.all(np.isfinite(k)) or k[0, 0] <= 0 or k[1, 1] <= 0:
        raise FusionError(f"{label}: camera matrix {k.tolist()} is not a pinhole K with positive focal lengths")
    h, w = frame.depth_mm.shape
    if not (0 <= k[0, 2] <= w and 0 <= k[1, 2] <= h):
        raise FusionError(f"{label}: principal point ({k[0, 2]:.1f}, {k[1, 2]:.1f}) lies outside the {w}x{h} image: "
                          "wrong intrinsics for these images")
    pose = np.asarray(frame.world_T_camera, float)
    if pose.shape != (4, 4) or not np.all(np.isfinite(pose)) or \
            not np.allclose(pose[:3, :3] @ pose[:3, :3].T, np.eye(3), atol=1e-4):
        raise FusionError(f"{label}: world_T_camera is not a rigid 4x4 transform")
    valid = (frame.depth_mm > 0) & (frame.depth_mm < settings.depth_max_m * 1000)
    if valid.mean() < 0.01:
        raise FusionError(f"{label}: {valid.mean():.1%} of the depth pixels are within (0, {settings.depth_max_m} m]: "
                          "no depth (is the depth stream on, and in millimetres?)")


def fuse(frames: list[PosedFrame], settings: FusionSettings = FusionSettings()) -> FusedSurface:
    """Integrate the frames into one TSDF and extract its colored triangle mesh."""
    if not frames:
        raise FusionError("no frames to fuse")
    for frame in frames:
        check_frame(frame, settings)
    device = o3c.Device("CPU:0")
    grid = o3d.t.geometry.VoxelBlockGrid(
        attr_names=("tsdf", "weight", "color"), attr_dtypes=(o3c.float32, o3c.float32, o3c.float32),
        attr_channels=((1), (1), (3)), voxel_size=settings.voxel_size_m, block_resolution=16,
        block_count=settings.block_count, device=device)
    for frame in frames:
        depth = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(frame.depth_mm.astype(np.uint16))))
        color = o3d.t.geometry.Image(o3c.Tensor(np.ascontiguousarray(frame.color.astype(np.uint8))))
        intrinsic = o3c.Tensor(np.asarray(frame.camera_matrix, float), o3c.float64)
        extrinsic = o3c.Tensor(np.linalg.inv(np.asarray(frame.world_T_camera, float)), o3c.float64)  # camera_T_world
        blocks = grid.compute_unique_block_coordinates(depth, intrinsic, extrinsic, 1000.0, settings.depth_max_m,
                                                       settings.truncation_voxels)
        grid.integrate(blocks, depth, color, intrinsic, intrinsic, extrinsic, 1000.0, settings.depth_max_m,
                       settings.truncation_voxels)
    mesh = grid.extract_triangle_mesh(weight_threshold=settings.min_weight).to_legacy()
    vertices = np.asarray(mesh.vertices)
    if len(vertices) == 0:
        raise FusionError(f"the {len(frames)} frames fused into an empty surface: do the poses put the frames' "
                          "views on one scene (camera-to-world, in metres)?")
    colors = np.clip(np.asarray(mesh.vertex_colors), 0.0, 1.0) if mesh.has_vertex_colors() else np.full_like(vertices, 0.5)
    return FusedSurface(vertices, np.asarray(mesh.triangles), colors, len(frames))


def frame_points(frame: PosedFrame, *, stride: int = 1, depth_max_m: float = 10.0) -> np.ndarray:
    """The frame's depth back-projected into world points (N, 3)."""
    depth = frame.depth_mm[::stride, ::stride].astype(float) / 1000.0
    v, u = np.mgrid[0:frame.depth_mm.shape[0]:stride, 0:frame.depth_mm.shape[1]:stride]
    k = np.asarray(frame.camera_matrix, float)
    valid = (depth > 0) & (depth < depth_max_m)
    z = depth[valid]
    points = np.column_stack([(u[valid] - k[0, 2]) * z / k[0, 0], (v[valid] - k[1, 2]) * z / k[1, 1], z])
    pose = np.asarray(frame.world_T_camera, float)
    return points @ pose[:3, :3].T + pose[:3, 3]


def point_to_mesh_distance_m(points: np.ndarray, surface: FusedSurface) -> np.ndarray:
    """Unsigned distance of each point to the surface (Open3D's RaycastingScene)."""
    scene = o3d.t.geometry.RaycastingScene()
    scene.add_triangles(o3c.Tensor(surface.vertices.astype(np.float32)),
                        o3c.Tensor(surface.triangles.astype(np.uint32)))
    return scene.compute_distance(o3c.Tensor(points.astype(np.float32))).numpy()
