"""Benchmark: the geometry build's speed and memory on the emulated cell, measured in one run.

    .venv/bin/python bench/geometry_scan.py [--repeat 3]

Renders the ten scan views of `twinloop build excite --kind scan` (wrist camera, 640x480,
the truth's noise) of the cell with an L-shaped bracket the description lacks, then times
fusion (frames per second), segmentation, the bracket's solid and convex parts
(geometry.collision) and the whole build into a twin version, and reports the peak
resident memory of this process. Prints the box's error against the truth alongside, so a
faster setting that loses accuracy shows.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from twinloop_builder.geometry.assembly import build_geometry_twin  # noqa: E402
from twinloop_builder.geometry.fusion import FusionSettings, fuse  # noqa: E402
from twinloop_builder.geometry.objects import SegmentationSettings, segment_table  # noqa: E402
from twinloop_builder.geometry.collision import object_meshes  # noqa: E402
from twinloop_builder.synthetic import bracket_cell, render_scan  # noqa: E402
from twinloop_twin.nominal import build_nominal_twin, twin_geometry  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workcell = load_workcell()
    started = time.perf_counter()
    frames, box = render_scan(workcell, load_physics(default_config_dir() / "emulated_truth.yaml"), seed=4,
                              extra=bracket_cell(workcell))
    render_s = (time.perf_counter() - started) / len(frames)
    box_truth = box[:3]
    settings = FusionSettings(depth_max_m=1.5)
    fuse_s, segment_s = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        surface = fuse(frames, settings)
        fuse_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        segmentation = segment_table(surface.vertices, SegmentationSettings(table_height_m=workcell.table_top_height_m))
        segment_s.append(time.perf_counter() - start)
    bracket = max(segmentation.objects, key=lambda o: o.size_m[0] * o.size_m[1])
    collision_s = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        meshes = object_meshes(bracket)
        collision_s.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as root:
        build_nominal_twin(Path(root), "emulated")
        start = time.perf_counter()
        surface = fuse(frames, settings)
        segmentation = segment_table(surface.vertices, SegmentationSettings(table_height_m=workcell.table_top_height_m))
        twin, _ = build_geometry_twin(root, "emulated", surface, segmentation)
        build_s = time.perf_counter() - start
        box_error_mm = np.linalg.norm(np.array(twin_geometry(twin).box_position_m) - box_truth) * 1e3
    fuse_median = float(np.median(fuse_s))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"fusion: {len(frames) / fuse_median:.1f} frames/s at 640x480, 4 mm voxels "
          f"({fuse_median:.2f} s for {len(frames)} frames; rendering them, set-up included, {render_s * 1e3:.0f} ms "
          f"per frame; fusion / rendering {fuse_median / len(frames) / render_s:.2f})")
    print(f"segmentation: {np.median(segment_s):.2f} s for {len(surface.vertices)} surface points")
    print(f"the bracket's solid, convex parts and visual mesh: {np.median(collision_s):.2f} s "
          f"({len(meshes.triangles)} triangles -> {len(meshes.parts)} convex parts, visual {len(meshes.visual_triangles)})")
    print(f"whole geometry build (fuse, segment, write the twin version): {build_s:.2f} s; "
          f"box {box_error_mm:.2f} mm from the truth")
    print(f"peak resident memory of this process: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
