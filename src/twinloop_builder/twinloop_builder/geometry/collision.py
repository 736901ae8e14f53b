"""A scanned object's watertight mesh, its convex collision parts and its visual mesh.

A scan sees an object from above and from the sides; what lies under its top surface is
unseen. The object is closed down to the table as a 2.5-D solid: a grid over its
footprint in the object's frame, each cell as high as the surface seen there, built as
stacked prisms of each height level's outline and united by manifold3d into one
watertight mesh (a union of boxes written by hand leaves T-junctions and edge-only
contacts: not a manifold). coacd splits that mesh into convex parts, which is what a simulator collides (MuJoCo takes each mesh's
convex hull: one hull of an L-shaped bracket would fill its notch). Open3D's quadric
decimation gives a light visual mesh. All in the object's frame (TableObject.world_T_object).
"""
from __future__ import annotations

from dataclasses import dataclass

import coacd
import cv2
import manifold3d
import numpy as np
import open3d as o3d

from twinloop_builder.geometry.objects import TableObject


class ObjectMeshError(ValueError):
    """The object's points make no solid; the message says why."""


@dataclass(frozen=True)
class CollisionSettings:
    cell_m: float = 0.004  # m, footprint grid (about the fusion's voxel)
    height_percentile: float = 90.0  # a cell's height: this percentile of its points (a noisy surface's max stands proud)
    height_step_m: float = 0.004  # m, cell heights are median-filtered and rounded to this: flat tops stay flat
    min_height_m: float = 0.004  # m, lower cells are the table (the TSDF rounds an object's foot into it)
    concavity: float = 0.1  # coacd threshold: concavity left in a part, relative to the bounding diagonal (~2 cm for a 12 cm L)
    max_parts: int = 8  # at most this many convex parts per object
    visual_triangles: int = 600  # the visual mesh is decimated to about this many triangles


@dataclass
class ObjectMeshes:
    vertices: np.ndarray  # (V, 3) the watertight solid, object frame
    triangles: np.ndarray  # (T, 3)
    parts: list[np.ndarray]  # convex collision parts, each (n, 3) vertices, object frame
    visual_vertices: np.ndarray
    visual_triangles: np.ndarray

    @property
    def volume_m3(self) -> float:
        return float(o3d.geometry.TriangleMesh(o3d.utility.Vector3dVector(self.vertices),
                                               o3d.utility.Vector3iVector(self.triangles)).get_volume())


def object_meshes(obj: TableObject, settings: CollisionSettings = CollisionSettings()) -> ObjectMeshes:
    """The object's solid closed down to the table, its convex parts and its visual mesh."""
    solid = _solid(obj, settings)
    mesh = solid.to_mesh()
    vertices = np.asarray(mesh.vert_properties, float)[:, :3]
    triangles = np.asarray(mesh.tri_verts, np.int64)
    coacd.set_log_level("error")
    parts = coacd.run_coacd(coacd.Mesh(vertices, triangles), threshold=settings.concavity,
                            max_convex_hull=settings.max_parts, preprocess_mode="off", seed=0)
    visual = o3d.geometry.TriangleMesh(o3d.utility.Vector3dVector(vertices), o3d.utility.Vector3iVector(triangles))
    if len(triangles) > settings.visual_triangles:
        visual = visual.simplify_quadric_decimation(settings.visual_triangles)
    return ObjectMeshes(vertices, triangles, [np.asarray(v, float) for v, _ in parts],
                        np.asarray(visual.vertices), np.asarray(visual.triangles))


def _solid(obj: TableObject, settings: CollisionSettings) -> manifold3d.Manifold:
    """The footprint grid's heights as stacked prisms: for each height level, the outline of
    the cells at least that high (manifold3d CrossSection, its collinear edges merged),
    extruded from the level below. A union of one box per cell is watertight too, but keeps
    two triangles per cell face (2348 for a 12 x 12 cm L at 4 mm), on which coacd 1.0.14
    ran for 10-15 s and crashed (SIGSEGV) in most runs here; the prisms of that L have 20."""
    grid, low, base = _height_grid(obj, settings)
    cell = settings.cell_m
    levels = sorted({float(h) for h in grid.ravel() if h > settings.min_height_m})
    if not levels:
        raise ObjectMeshError("no footprint cell stands above the table: nothing to close into a solid")
    prisms, below = [], 0.0
    for level in levels:
        footprint = grid >= level - 1e-9
        squares = [manifold3d.CrossSection.square([cell, cell]).translate([float(low[0] + i * cell), float(low[1] + j * cell)])
                   for (i, j), inside in np.ndenumerate(footprint) if inside]
        outline = manifold3d.CrossSection.batch_boolean(squares, manifold3d.OpType.Add).simplify(cell / 10.0)
        prisms.append(manifold3d.Manifold.extrude(outline, level - below).translate([0.0, 0.0, base + below]))
        below = level
    if not prisms:
        raise ObjectMeshError("the object's footprint is under two grid cells wide: too thin to close into a solid")
    return manifold3d.Manifold.batch_boolean(prisms, manifold3d.OpType.Add).as_original().simplify(cell / 10.0)


def _height_grid(obj: TableObject, settings: CollisionSettings) -> tuple[np.ndarray, np.ndarray, float]:
    """(cell heights above the table, the grid's corner (x, y) and the table's z, both in the
    object's frame). Each cell: a percentile of the heights of the points in it; small holes
    in the footprint (cells no vertex fell in) are closed with their neighbours' height;
    heights are median-filtered and rounded down from the object's top in height steps
    (surface noise would make every cell a different height: a top of many small steps)."""
    local = (obj.points - obj.world_T_object[:3, 3]) @ obj.world_T_object[:3, :3]
    top = float(obj.size_m[2])
    base = -top / 2.0
    height = local[:, 2] - base
    keep = height > settings.min_height_m
    if keep.sum() < 10:
        raise ObjectMeshError(f"{int(keep.sum())} of the object's points stand over {settings.min_height_m * 1e3:.0f} mm "
                              "above the table: nothing to close into a solid")
    cell = settings.cell_m
    low = local[keep, :2].min(axis=0)
    index = np.floor((local[keep, :2] - low) / cell).astype(int)
    shape = index.max(axis=0) + 1
    grid = np.zeros(shape)
    order = np.lexsort((height[keep], index[:, 1], index[:, 0]))
    flat = index[order, 0] * shape[1] + index[order, 1]
    for key, members in zip(*np.unique(flat, return_index=True)):
        end = np.searchsorted(flat, key, side="right")
        grid.flat[key] = np.percentile(height[keep][order][members:end], settings.height_percentile)
    occupied = (grid > 0).astype(np.uint8)
    closed = cv2.morphologyEx(occupied, cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    filled = cv2.dilate(grid.astype(np.float32), np.ones((3, 3), np.uint8))
    grid = np.where(occupied > 0, grid, np.where(closed > 0, filled, 0.0))
    grid = cv2.medianBlur(grid.astype(np.float32), 3).astype(float)
    steps_down = np.maximum(np.round((top - grid) / settings.height_step_m), 0.0)
    grid = np.where(grid > 0, top - steps_down * settings.height_step_m, 0.0)
    # A band one cell wide at a lower height along the footprint's edge is where a side
    # wall's points fell just outside the top's edge (95 such cells round the L's top), not
    # a step of the object: cells of a level that a 3 x 3 opening removes and that touch the
    # outside are dropped (a real step is wider than two cells, 8 mm).
    kernel = np.ones((3, 3), np.uint8)
    outside = cv2.dilate((grid == 0).astype(np.uint8), kernel) > 0
    for level in np.unique(grid[(grid > 0) & (grid < top - 1e-9)]):
        own = (grid == level).astype(np.uint8)
        thin = (own > 0) & (cv2.morphologyEx(own, cv2.MORPH_OPEN, kernel) == 0)
        grid[thin & outside] = 0.0
    return grid, low, base
