"""Is a set of calibration views able to determine a hand-eye transform?

Pure Python (no rclpy). Hand-eye needs rotations of the gripper about at least two
non-parallel axes (Tsai & Lenz 1989); with rotations about one axis only, the translation
along that axis is unobservable. This module measures the rotation spread of the views
and refuses sets that cannot be trusted, saying which poses to add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.spatial.transform import Rotation

AXIS_NAMES = ("x", "y", "z")


class CalibrationError(RuntimeError):
    """A calibration cannot be done as asked. `code` is a twinloop_interfaces ErrorCode name."""

    code = "UNKNOWN"


class DegenerateData(CalibrationError):
    """The data cannot determine the result to the required accuracy; the message says
    what is missing and which poses to add."""

    code = "DEGENERATE_DATA"


class InconsistentInput(CalibrationError):
    """Inputs do not belong together (counts, sizes); the message says which."""

    code = "INVALID_ARGUMENT"


@dataclass(frozen=True)
class DiversityReport:
    views: int
    rotation_spread_deg: tuple[float, float, float]  # std of orientation along the principal axes, largest first
    weakest_axis_gripper: tuple[float, float, float]  # unit axis (gripper frame) with the least rotation
    max_rotation_deg: float  # largest rotation between any two views

    def describe(self) -> str:
        spread = ", ".join(f"{s:.1f}" for s in self.rotation_spread_deg)
        return (f"{self.views} views; orientation spread along the principal axes {spread} deg; "
                f"least about gripper axis {_axis_text(self.weakest_axis_gripper)}")


def _axis_text(axis: Sequence[float]) -> str:
    axis = np.asarray(axis, dtype=float)
    dominant = int(np.argmax(np.abs(axis)))
    return f"[{axis[0]:+.2f} {axis[1]:+.2f} {axis[2]:+.2f}] (mostly {AXIS_NAMES[dominant]})"


def rotation_diversity(base_T_gripper: Sequence[np.ndarray]) -> DiversityReport:
    rotations = Rotation.from_matrix(np.array([t[:3, :3] for t in base_T_gripper]))
    mean = rotations.mean()
    # Orientation of each view relative to the mean, in the gripper frame.
    rotvecs = (mean.inv() * rotations).as_rotvec()
    scatter = rotvecs.T @ rotvecs / max(1, len(rotvecs))
    values, vectors = np.linalg.eigh(scatter)
    spread = np.degrees(np.sqrt(np.clip(values[::-1], 0.0, None)))
    max_rotation = max((float(np.degrees(np.max((rotations[i].inv() * rotations).magnitude())))
                        for i in range(len(rotvecs))), default=0.0)
    return DiversityReport(len(rotvecs), tuple(float(s) for s in spread), tuple(float(v) for v in vectors[:, 0]),
                           max_rotation)


def check_views(base_T_gripper: Sequence[np.ndarray], *, min_views: int = 5,
                min_rotation_spread_deg: float = 3.0) -> DiversityReport:
    """Raise DegenerateData unless the views can determine a hand-eye transform."""
    count = len(base_T_gripper)
    if count < min_views:
        raise DegenerateData(
            f"only {count} usable view(s); hand-eye calibration needs at least {min_views} (2 is the "
            "mathematical minimum and gives no check at all). Add views that rotate the gripper about "
            "different axes, with the target in view.")
    report = rotation_diversity(base_T_gripper)
    if report.rotation_spread_deg[0] < min_rotation_spread_deg:
        raise DegenerateData(
            f"the gripper barely rotates between views ({report.describe()}); the hand-eye rotation is "
            f"unobservable. Add views rotated by at least +-{2 * min_rotation_spread_deg:.0f} deg about "
            "two different gripper axes.")
    if report.rotation_spread_deg[1] < min_rotation_spread_deg:
        raise DegenerateData(
            f"all rotations between views are about one axis ({report.describe()}); the translation "
            "along that axis cannot be determined. Add views rotated by at least "
            f"+-{2 * min_rotation_spread_deg:.0f} deg about gripper axis "
            f"{_axis_text(report.weakest_axis_gripper)} and about the axis perpendicular to both.")
    return report


def check_precision(covariance: np.ndarray, *, max_translation_std_m: float,
                    max_rotation_std_deg: float, what: str, cause: str = "") -> None:
    """Refuse a result whose 1-sigma uncertainty exceeds the limits; name the worst direction
    and what to do: `cause` when the caller knows why (replaces the advice on views)."""
    translation = covariance[:3, :3]
    rotation = covariance[3:, 3:]
    t_values, t_vectors = np.linalg.eigh(translation)
    r_values, r_vectors = np.linalg.eigh(rotation)
    t_std = float(np.sqrt(max(t_values[-1], 0.0)))
    r_std = float(np.degrees(np.sqrt(max(r_values[-1], 0.0))))
    if t_std > max_translation_std_m:
        raise DegenerateData(
            f"{what}: translation uncertainty {t_std * 1e3:.1f} mm (1 sigma) along "
            f"{_axis_text(t_vectors[:, -1])} exceeds {max_translation_std_m * 1e3:.1f} mm; " + (cause or (
                "add views with larger rotations about axes perpendicular to that direction, and closer views "
                "of the target.")))
    if r_std > max_rotation_std_deg:
        raise DegenerateData(
            f"{what}: rotation uncertainty {r_std:.2f} deg (1 sigma) about {_axis_text(r_vectors[:, -1])} "
            f"exceeds {max_rotation_std_deg:.2f} deg; " + (cause or (
                "add views with the target nearer the image borders and tilted views.")))
