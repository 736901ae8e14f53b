"""Calibration targets: descriptions (config/calibration_targets.yaml) and detection.

Pure Python (no rclpy). Detection is OpenCV's (cv2.aruco.CharucoDetector,
cv2.findChessboardCornersSB, cv2.findCirclesGrid); this module only fixes the point
ordering so that every view of a target uses the same target frame.

Target frames (all z into the board, so that a solvePnP result is camera_T_target):
- charuco: OpenCV's ChArUco board frame (origin at the outer corner of the first square).
- chessboard: origin at the first inner corner OpenCV reports, x along `inner_corners_x`.
- circle_grid: origin at the marked dot (`origin_marker: large_dot`, the ros-industrial
  "modified circle grid"), x along `cols`, y along `rows`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

KINDS = ("charuco", "chessboard", "circle_grid")
MIN_CHARUCO_CORNERS = 6


class TargetConfigError(ValueError):
    """A target description is malformed; the message names the file and key."""


class TargetNotFound(RuntimeError):
    """The target is not (fully enough) visible in an image."""


@dataclass(frozen=True)
class TargetSpec:
    name: str
    kind: str  # one of KINDS
    cols: int  # charuco: squares_x; chessboard: inner corners along x; circle grid: dots along x
    rows: int  # charuco: squares_y; chessboard: inner corners along y; circle grid: dots along y
    spacing_m: float  # charuco/chessboard: square side; circle grid: dot centre spacing
    marker_length_m: float = 0.0  # charuco only
    dictionary: str = ""  # charuco only: cv2.aruco predefined dictionary name
    origin_marker: str = "none"  # circle grid: "large_dot" or "none"

    @property
    def point_count(self) -> int:
        if self.kind == "charuco":
            return (self.cols - 1) * (self.rows - 1)
        return self.cols * self.rows

    def object_points(self) -> np.ndarray:
        """All target points in the target frame (N x 3, metres), indexed by point id."""
        if self.kind == "charuco":
            return np.asarray(charuco_board(self).getChessboardCorners(), dtype=float).reshape(-1, 3)
        r, c = np.mgrid[0:self.rows, 0:self.cols]
        xy = np.stack([c.ravel(), r.ravel()], axis=1) * self.spacing_m
        return np.column_stack([xy, np.zeros(len(xy))])


@dataclass(frozen=True)
class Detection:
    """Target points found in one image: ids index TargetSpec.object_points()."""

    ids: np.ndarray  # (N,) int
    object_points: np.ndarray  # (N, 3) m, target frame
    image_points: np.ndarray  # (N, 2) px

    def __len__(self) -> int:
        return len(self.ids)


# ------------------------------------------------------------------------- descriptions

def load_targets(path: Path | str) -> tuple[dict[str, TargetSpec], str]:
    """({name: spec}, default name) from a calibration_targets.yaml."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise TargetConfigError(f"cannot read target file {path}: {error}") from error
    if not isinstance(raw, dict) or not isinstance(raw.get("targets"), dict) or not raw["targets"]:
        raise TargetConfigError(f"{path}: expected a mapping with a non-empty 'targets' mapping")
    unknown = set(raw) - {"default", "targets"}
    if unknown:
        raise TargetConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; use 'default' and 'targets'")
    targets = {name: parse_target(name, value, path) for name, value in raw["targets"].items()}
    default = raw.get("default", next(iter(targets)))
    if default not in targets:
        raise TargetConfigError(f"{path}: default target '{default}' is not one of {sorted(targets)}")
    return targets, default


def parse_target(name: str, raw: Any, path: Path | str = "<targets>") -> TargetSpec:
    where = f"{path}: targets.{name}"
    if not isinstance(raw, dict):
        raise TargetConfigError(f"{where} must be a mapping")
    kind = raw.get("type")
    fields = {
        "charuco": {"type", "squares_x", "squares_y", "square_length_m", "marker_length_m", "dictionary"},
        "chessboard": {"type", "inner_corners_x", "inner_corners_y", "square_length_m"},
        "circle_grid": {"type", "cols", "rows", "spacing_m", "origin_marker"},
    }
    if kind not in fields:
        raise TargetConfigError(f"{where}.type is {kind!r}; use one of {list(KINDS)}")
    extra = set(raw) - fields[kind]
    if extra:
        raise TargetConfigError(f"{where}: unknown key(s) {sorted(extra)} for type {kind}; "
                                f"known: {sorted(fields[kind])}")

    def integer(key: str, minimum: int) -> int:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise TargetConfigError(f"{where}.{key} must be an integer >= {minimum}, got {value!r}")
        return value

    def length(key: str) -> float:
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise TargetConfigError(f"{where}.{key} must be a positive length in metres, got {value!r}")
        return float(value)

    if kind == "charuco":
        spec = TargetSpec(name, kind, integer("squares_x", 3), integer("squares_y", 3), length("square_length_m"),
                          length("marker_length_m"), str(raw.get("dictionary", "")))
        if spec.marker_length_m >= spec.spacing_m:
            raise TargetConfigError(f"{where}.marker_length_m must be smaller than square_length_m")
        if not hasattr(cv2.aruco, spec.dictionary) or not spec.dictionary.startswith("DICT_"):
            raise TargetConfigError(f"{where}.dictionary {spec.dictionary!r} is not a cv2.aruco dictionary; "
                                    "use e.g. DICT_5X5_100")
        return spec
    if kind == "chessboard":
        return TargetSpec(name, kind, integer("inner_corners_x", 3), integer("inner_corners_y", 3),
                          length("square_length_m"))
    marker = raw.get("origin_marker", "none")
    if marker not in ("none", "large_dot"):
        raise TargetConfigError(f"{where}.origin_marker is {marker!r}; use 'large_dot' or 'none'")
    return TargetSpec(name, kind, integer("cols", 3), integer("rows", 3), length("spacing_m"),
                      origin_marker=marker)


def charuco_board(spec: TargetSpec):
    dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, spec.dictionary))
    return cv2.aruco.CharucoBoard((spec.cols, spec.rows), spec.spacing_m, spec.marker_length_m, dictionary)


# ------------------------------------------------------------------------- detection

class TargetDetector:
    """Finds one target in grayscale (or RGB) images."""

    def __init__(self, spec: TargetSpec, *, min_points: int | None = None) -> None:
        self.spec = spec
        self._object_points = spec.object_points()
        self.min_points = min_points if min_points is not None else (
            MIN_CHARUCO_CORNERS if spec.kind == "charuco" else spec.point_count)
        if spec.kind == "charuco":
            self._charuco = cv2.aruco.CharucoDetector(charuco_board(spec))

    def detect(self, image: np.ndarray) -> Detection:
        gray = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        if self.spec.kind == "charuco":
            corners, ids, _, _ = self._charuco.detectBoard(gray)
            if ids is None or len(ids) < self.min_points:
                found = 0 if ids is None else len(ids)
                raise TargetNotFound(f"ChArUco target '{self.spec.name}': {found} corners found, "
                                     f"{self.min_points} needed; bring more of the board into view")
            ids = ids.ravel().astype(int)
            return Detection(ids, self._object_points[ids], corners.reshape(-1, 2).astype(float))
        if self.spec.kind == "chessboard":
            ok, corners = cv2.findChessboardCornersSB(gray, (self.spec.cols, self.spec.rows))
            if not ok:
                raise TargetNotFound(f"chessboard '{self.spec.name}' ({self.spec.cols}x{self.spec.rows} inner "
                                     "corners) not found; the whole board must be visible")
            points = corners.reshape(-1, 2).astype(float)
            return Detection(np.arange(len(points)), self._object_points, points)
        ok, centers = cv2.findCirclesGrid(gray, (self.spec.cols, self.spec.rows),
                                          flags=cv2.CALIB_CB_SYMMETRIC_GRID)
        if not ok:
            raise TargetNotFound(f"circle grid '{self.spec.name}' ({self.spec.cols}x{self.spec.rows}) not found; "
                                 "the whole grid must be visible")
        grid = _canonical_grid(gray, centers.reshape(self.spec.rows, self.spec.cols, 2).astype(float),
                               self.spec)
        return Detection(np.arange(self.spec.point_count), self._object_points, grid.reshape(-1, 2))


def _dihedral(grid: np.ndarray) -> list[np.ndarray]:
    out = []
    for k in range(4):
        rotated = np.rot90(grid, k, axes=(0, 1))
        out += [rotated, np.swapaxes(rotated, 0, 1)]
    return out


def _canonical_grid(gray: np.ndarray, grid: np.ndarray, spec: TargetSpec) -> np.ndarray:
    """Reorder the dot grid: marked dot at [0, 0] and z into the board (x right of y in the image)."""
    candidates = []
    for option in _dihedral(grid):
        if option.shape[:2] != (spec.rows, spec.cols):
            continue
        x_axis, y_axis = option[0, 1] - option[0, 0], option[1, 0] - option[0, 0]
        if x_axis[0] * y_axis[1] - x_axis[1] * y_axis[0] > 0:
            candidates.append(option)
    if spec.origin_marker == "large_dot":
        scores = [_dot_darkness(gray, option) for option in candidates]
        order = np.argsort(scores)[::-1]
        if len(order) > 1 and scores[order[1]] > 0.6 * scores[order[0]]:
            raise TargetNotFound(f"circle grid '{spec.name}': the large origin dot cannot be told from the "
                                 "other corner dots; check lighting and focus")
        return candidates[order[0]]
    # No marker: the ordering whose origin is nearest the image's top-left corner.
    return min(candidates, key=lambda option: float(option[0, 0].sum()))


def _dot_darkness(gray: np.ndarray, grid: np.ndarray) -> float:
    """Area of the dot at grid[0, 0] in units of spacing^2 (a larger dot scores higher):
    the dark connected blob under the centre, thresholded halfway between the dot's core
    and the board around it."""
    centre = grid[0, 0]
    spacing = 0.5 * (np.linalg.norm(grid[0, 1] - centre) + np.linalg.norm(grid[1, 0] - centre))
    radius = int(math.ceil(0.55 * spacing))
    x0, y0 = int(round(centre[0])), int(round(centre[1]))
    top, left = max(0, y0 - radius), max(0, x0 - radius)
    patch = gray[top:y0 + radius + 1, left:x0 + radius + 1].astype(float)
    if patch.size == 0 or not (0 <= y0 - top < patch.shape[0] and 0 <= x0 - left < patch.shape[1]):
        return 0.0
    ys, xs = np.mgrid[top:top + patch.shape[0], left:left + patch.shape[1]]
    distance = np.hypot(xs - centre[0], ys - centre[1])
    ring = patch[(distance >= 0.45 * spacing) & (distance <= 0.55 * spacing)]
    core = patch[distance <= 0.1 * spacing]
    if ring.size == 0 or core.size == 0:
        return 0.0
    threshold = 0.5 * (np.median(ring) + core.mean())
    _, labels = cv2.connectedComponents((patch < threshold).astype(np.uint8), connectivity=8)
    label = labels[y0 - top, x0 - left]
    if label == 0:
        return 0.0
    return float((labels == label).sum()) / spacing ** 2
