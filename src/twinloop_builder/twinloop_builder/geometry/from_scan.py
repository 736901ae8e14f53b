"""A scan bag into the next twin version: read, fuse, segment, assemble.

The one sequence behind `twinloop build geometry --scan BAG` and the twin builder's
BuildTwin goal with a scan bag; `progress(stage, fraction, message)` is told each stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from twinloop_twin.bundle import SourceBag, TwinBundle, load_twin_version
from twinloop_twin.nominal import ensure_nominal_twin, load_twin_workcell

from twinloop_builder.geometry.assembly import AssemblySettings, GeometryBuildError, build_geometry_twin
from twinloop_builder.geometry.fusion import FusionError, FusionSettings, fuse
from twinloop_builder.geometry.objects import SegmentationError, SegmentationSettings, segment_table
from twinloop_builder.geometry.scan_bag import scan_frames
from twinloop_builder.recording import bag_sha256

# what a scan can end in besides a TwinError (each message says what was wrong and what to do)
SCAN_ERRORS = (FusionError, SegmentationError, GeometryBuildError)

Progress = Callable[[str, float, str], None]


@dataclass(frozen=True)
class ScanBuildSettings:
    voxel_size_m: float = 0.004  # m, TSDF voxel
    depth_max_m: float = 1.5  # m, farther depth is not integrated
    assembly: AssemblySettings = AssemblySettings()


@dataclass
class ScanBuild:
    twin: TwinBundle
    report: dict[str, Any]
    frames: int

    def summary(self) -> list[str]:
        """What was built, a line per finding."""
        box = self.report["box"]
        lines = [f"table top {self.report['table_top_height_m']:.4f} m "
                 f"({self.report['table_offset_from_description_mm']:+.1f} mm from the description); box "
                 f"{box['size_mm']} mm (x{box['size_ratio_to_description']:.3f} the described size)"]
        for obj in self.report["objects"]:
            collision = obj.get("collision")
            detail = (f", {collision['convex_parts']} convex parts, {collision['solid_volume_cm3']} cm3"
                      if isinstance(collision, dict) else f", collides as {collision}" if collision else "")
            lines.append(f"object at {obj['centre_m']} m, {obj['size_mm']} mm: {obj['taken_for']}{detail}")
        return lines


def build_geometry_from_scan(root: Path | str, workcell: str, scan: Path | str, *, calibration: str | None = None,
                             parent_version: int | None = None, settings: ScanBuildSettings = ScanBuildSettings(),
                             progress: Progress = lambda stage, fraction, message: None) -> ScanBuild:
    """The next version of `workcell` under `root`: the parent's (default: the latest; the
    nominal twin is built first when there is none) with the geometry of the scan."""
    root = Path(root)
    progress("twin", 0.0, f"parent twin of {workcell}")
    parent = (ensure_nominal_twin(root, workcell, progress=lambda message: progress("twin", 0.0, message))
              if parent_version is None else load_twin_version(root, workcell, parent_version))
    description = load_twin_workcell(parent)
    progress("read", 0.05, f"reading {scan}")
    frames = scan_frames(scan, description, calibration_file=calibration)
    progress("fuse", 0.3, f"fusing {len(frames)} still frames ({settings.voxel_size_m * 1e3:g} mm voxels)")
    surface = fuse(frames, FusionSettings(voxel_size_m=settings.voxel_size_m, depth_max_m=settings.depth_max_m))
    progress("segment", 0.6, f"segmenting {len(surface.vertices)} surface points")
    segmentation = segment_table(surface.vertices, SegmentationSettings(table_height_m=description.table_top_height_m))
    progress("assemble", 0.75, f"{len(segmentation.objects)} objects on the table; writing the next version")
    bag = SourceBag(path=str(Path(scan).resolve()), sha256=bag_sha256(scan), split="fit", purpose="identification")
    twin, report = build_geometry_twin(root, workcell, surface, segmentation, parent_version=parent.version,
                                       source_bags=(bag,), source={"scan": str(scan), "frames": len(frames)},
                                       settings=settings.assembly)
    progress("done", 1.0, f"version v{twin.version} of {workcell} written")
    return ScanBuild(twin, report, len(frames))
