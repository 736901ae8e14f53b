"""A scanned object's solid, convex parts and visual mesh (geometry.collision), from surface
points sampled on a known L-shaped bracket, and the geometry layer that carries them."""
from __future__ import annotations

import re

import mujoco
import numpy as np
import open3d as o3d
import pytest
from scipy.spatial import Delaunay

from twinloop_builder.geometry.collision import ObjectMeshError, object_meshes
from twinloop_builder.geometry.objects import segment_table
from twinloop_twin.geometry_layer import GeometryLayer, GeometryLayerError, ScannedObject, apply_to_spec, \
    load_geometry_layer

TABLE_M = 0.75
# the bracket's two arms, (x range, y range) in m, 5 cm high: an L whose notch is x > 0.04, y > 0.04
ARMS = (((0.0, 0.12), (0.0, 0.04)), ((0.0, 0.04), (0.04, 0.12)))
HEIGHT_M = 0.05
SPACING_M = 0.002


def _bracket_surface(rng) -> np.ndarray:
    """What a scan from above and around sees: the top and the side walls (not the bottom),
    with 0.5 mm noise, standing on a table sampled around it."""
    points = []
    for (x0, x1), (y0, y1) in ARMS:
        gx, gy = np.meshgrid(np.arange(x0, x1, SPACING_M), np.arange(y0, y1, SPACING_M))
        points.append(np.column_stack([gx.ravel(), gy.ravel(), np.full(gx.size, HEIGHT_M)]))
        for z in np.arange(0.0, HEIGHT_M, SPACING_M):
            for x in np.arange(x0, x1, SPACING_M):
                points += [[[x, y0, z]], [[x, y1, z]]]
            for y in np.arange(y0, y1, SPACING_M):
                points += [[[x0, y, z]], [[x1, y, z]]]
    bracket = np.vstack(points)
    inside_other = np.zeros(len(bracket), bool)  # walls where the arms meet are inside the solid
    for (x0, x1), (y0, y1) in ARMS:
        inside_other |= (bracket[:, 0] > x0 + 1e-6) & (bracket[:, 0] < x1 - 1e-6) & \
            (bracket[:, 1] > y0 + 1e-6) & (bracket[:, 1] < y1 - 1e-6) & (bracket[:, 2] < HEIGHT_M - 1e-6)
    bracket = bracket[~inside_other]
    gx, gy = np.meshgrid(np.arange(-0.15, 0.27, 0.004), np.arange(-0.15, 0.27, 0.004))
    table = np.column_stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)])
    cloud = np.vstack([bracket, table]) + rng.normal(0.0, 0.0005, (len(bracket) + len(table), 3))
    return cloud + [0.5, 0.2, TABLE_M]


def _in_bracket(points: np.ndarray, grow: float) -> np.ndarray:
    return np.any([(points[:, 0] > x0 - grow) & (points[:, 0] < x1 + grow) & (points[:, 1] > y0 - grow)
                   & (points[:, 1] < y1 + grow) for (x0, x1), (y0, y1) in ARMS], axis=0)


@pytest.fixture(scope="module")
def bracket():
    segmentation = segment_table(_bracket_surface(np.random.default_rng(3)))
    assert len(segmentation.objects) == 1
    obj = segmentation.objects[0]
    return obj, object_meshes(obj)


def test_the_solid_is_watertight_with_the_bracket_volume(bracket):
    _, meshes = bracket
    mesh = o3d.geometry.TriangleMesh(o3d.utility.Vector3dVector(meshes.vertices),
                                     o3d.utility.Vector3iVector(meshes.triangles))
    true_volume = sum((x1 - x0) * (y1 - y0) for (x0, x1), (y0, y1) in ARMS) * HEIGHT_M
    print(f"solid: {len(meshes.triangles)} triangles, {meshes.volume_m3 * 1e6:.1f} cm3 (true {true_volume * 1e6:.1f}); "
          f"{len(meshes.parts)} convex parts; visual {len(meshes.visual_triangles)} triangles")
    assert mesh.is_watertight()
    # the footprint grows by up to a 4 mm cell where a wall's points fall: within 25 %
    assert true_volume <= meshes.volume_m3 <= 1.25 * true_volume
    assert 0 < len(meshes.visual_triangles) <= 700


def test_convex_parts_cover_the_bracket_and_leave_its_notch_free(bracket):
    obj, meshes = bracket
    assert 2 <= len(meshes.parts) <= 8
    gx, gy, gz = np.meshgrid(np.arange(-0.03, 0.15, 0.002), np.arange(-0.03, 0.15, 0.002),
                             np.arange(0.005, HEIGHT_M - 0.004, 0.005), indexing="ij")
    grid = np.column_stack([gx.ravel(), gy.ravel(), gz.ravel()])
    world = grid + [0.5, 0.2, TABLE_M]
    local = (world - obj.world_T_object[:3, 3]) @ obj.world_T_object[:3, :3]
    collides = np.any([Delaunay(p).find_simplex(local) >= 0 for p in meshes.parts], axis=0)
    well_inside, well_outside = _in_bracket(grid, -0.003), ~_in_bracket(grid, 0.006)
    notch = (grid[:, 0] > 0.046) & (grid[:, 1] > 0.046) & (grid[:, 0] < 0.12) & (grid[:, 1] < 0.12)
    print(f"inside covered {collides[well_inside].mean():.4f}, outside (6 mm) colliding "
          f"{collides[well_outside].mean():.4f}, notch colliding {collides[notch].mean():.4f}")
    assert collides[well_inside].mean() >= 0.99
    assert collides[well_outside].mean() <= 0.01 and collides[notch].mean() <= 0.02


def test_an_object_flat_on_the_table_makes_no_solid(bracket):
    obj, _ = bracket
    flat = type(obj)(obj.world_T_object, obj.size_m, obj.points[:0])
    with pytest.raises(ObjectMeshError, match="nothing to close into a solid"):
        object_meshes(flat)


def test_the_layer_carries_the_parts_into_the_scene_and_refuses_a_broken_mesh(bracket, tmp_path):
    obj, meshes = bracket
    scanned = ScannedObject("bracket", tuple(obj.world_T_object[:3, 3]), (1.0, 0.0, 0.0, 0.0), tuple(obj.size_m),
                            tuple(tuple(map(tuple, p)) for p in meshes.parts), tuple(map(tuple, meshes.visual_vertices)),
                            tuple(map(tuple, meshes.visual_triangles)))
    path = tmp_path / "geometry.yaml"
    path.write_text(GeometryLayer(TABLE_M, (0.4, -0.2, 0.78), (1, 0, 0, 0), (scanned,)).to_yaml())
    layer = load_geometry_layer(path)
    assert len(layer.objects[0].collision_parts) == len(meshes.parts)
    np.testing.assert_allclose(layer.objects[0].visual_vertices, meshes.visual_vertices, atol=1e-6)
    spec = mujoco.MjSpec()
    spec.worldbody.add_body(name="table", pos=[0, 0, 0.7])
    apply_to_spec(spec, layer)
    model = spec.compile()
    names = [model.geom(g).name for g in range(model.ngeom)]
    assert sum(n.startswith("scanned_bracket_collision") for n in names) == len(meshes.parts)
    assert "scanned_bracket_visual" in names and model.nmesh == len(meshes.parts) + 1
    broken = re.sub(r"(triangles:\n\s*- \[)\d+", r"\g<1>99999", path.read_text(), count=1)
    assert broken != path.read_text()
    path.write_text(broken)
    with pytest.raises(GeometryLayerError, match="names a vertex it does not have"):
        load_geometry_layer(path)
