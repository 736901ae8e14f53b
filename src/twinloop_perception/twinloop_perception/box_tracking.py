"""The box's pose from one static RGB-D camera: segmentation, then ICP against the box's shape.

What a real cell offers is all it reads: an aligned color + depth frame, the camera's
intrinsics and pose in `world` (the URDF mount or an eye-to-hand calibration), the table's
height and the box's size and color from the workcell description.

Per frame:
1. Candidate pixels: a valid depth, the box's color (HSV gate; it keeps the arm out where it
   touches the box), back-projected into `world`, and between a few mm above the table and a
   little above the box's top (the table and the arm's higher links out).
2. Near the last estimate when tracking; the points around their median otherwise.
3. Point-to-plane ICP (Open3D, Tukey loss) of the points against the box's surface sampled
   in its own frame, from the last estimate, or, on a first detection, from the top face's
   centre and its minimum-area rectangle's yaw.
4. The covariance from the fit's Jacobian, sigma^2 (J^T J)^-1 with sigma the fit's residual,
   scaled and floored by numbers set in `config/box_tracker.yaml` (test/test_box_tracking.py
   checks the coverage against the emulated cell's ground truth): the depth noise of
   neighbouring pixels and the residual shape error are not independent, which the
   Jacobian alone assumes.

A box has symmetric orientations (24 for a cube); the one reported is the one nearest the
last estimate, so the orientation is continuous while tracking. Scoring against truth
uses `symmetric_rotation_error_rad`.

Open3D does the registration; what is written here is the segmentation, the initial guess
and the covariance, which no library provides for this case.
"""
from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import cv2
import numpy as np
import open3d as o3d

FOUND = "found"
LOST = "lost"


class BoxTrackingError(ValueError):
    """A setting or an input that cannot work (e.g. depth and color of different sizes)."""


@dataclass(frozen=True)
class Pinhole:
    width: int  # px
    height: int  # px
    fx: float  # px
    fy: float  # px
    cx: float  # px
    cy: float  # px


@dataclass(frozen=True)
class BoxTrackerSettings:
    size_m: tuple[float, float, float]  # m, the box's edge lengths along its x, y, z
    table_height_m: float  # m, the table's top in `world`
    # color gate (HSV, OpenCV's 0-180 hue scaled to degrees); off: geometry only
    color_gate: bool = True
    hue_deg: float = 4.0  # deg, the box's hue (red ~ 0)
    hue_tolerance_deg: float = 18.0  # deg
    min_saturation: float = 0.45  # 0-1
    min_value: float = 0.12  # 0-1
    above_table_m: float = 0.006  # m, points nearer the table plane are table
    above_box_m: float = 0.02  # m, points higher than the box's top plus this are not the box
    search_radius_m: float = 0.12  # m, around the last estimate while tracking
    # where to look when not tracking: around the box's usual place (None: the whole view,
    # which only the color gate makes safe: the robot and the board stand above the table too)
    initial_xy_m: tuple[float, float] | None = None  # m, in `world`
    initial_search_radius_m: float = 0.25  # m
    min_points: int = 60  # fewer box points: lost
    max_points: int = 1000  # more are thinned evenly before the fit (its cost grows with them)
    icp_coarse_distance_m: float = 0.03  # m, first pass: the box may have moved this far since the last frame
    icp_max_distance_m: float = 0.01  # m, final pass: correspondences farther apart are ignored
    icp_iterations: int = 30
    max_rms_m: float = 0.005  # m, a fit worse than this is not the box: lost
    max_rms_ratio: float = 1.5  # a fit this much worse than the median of the last good ones: lost
    model_spacing_m: float = 0.003  # m, spacing of the box surface samples
    # A box resting on the table: its centre half its height above the table and a face down,
    # as a prior with these 1-sigma; it carries the pose where the view does not (the hand over
    # the top face leaves the height unobserved: 7-9 mm errors without it)
    resting_on_table: bool = True
    resting_height_std_m: float = 0.001  # m
    resting_tilt_std_rad: float = 0.02  # rad
    covariance_scale: float = 1.0  # variance multiplier measured against ground truth
    position_std_floor_m: float = 0.0005  # m
    rotation_std_floor_rad: float = 0.005  # rad

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__
                  if name not in ("color_gate", "resting_on_table") and not (name == "initial_xy_m" and self.initial_xy_m is None)}
        for name, value in values.items():
            flat = value if isinstance(value, tuple) else (value,)
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in flat):
                raise BoxTrackingError(f"box tracker setting {name} must be finite numbers, got {value!r}")
        if len(self.size_m) != 3 or min(self.size_m) <= 0:
            raise BoxTrackingError(f"box size_m must be three positive edge lengths in m, got {self.size_m!r}")
        positive = ("search_radius_m", "initial_search_radius_m", "icp_coarse_distance_m", "icp_max_distance_m", "max_rms_m", "model_spacing_m", "covariance_scale",
                    "min_points", "max_points", "icp_iterations", "max_rms_ratio", "resting_height_std_m", "resting_tilt_std_rad")
        for name in positive:
            if values[name] <= 0:
                raise BoxTrackingError(f"box tracker setting {name} must be > 0, got {values[name]!r}")


@dataclass
class BoxEstimate:
    status: str  # FOUND or LOST
    reason: str = ""  # why LOST, in words
    world_T_box: np.ndarray | None = None  # 4x4
    covariance: np.ndarray | None = None  # 6x6: x, y, z (m) and rotation about world x, y, z (rad)
    points: int = 0  # box points used
    rms_m: float = math.nan  # point-to-plane residual of the fit
    fitness: float = math.nan  # fraction of the points with a correspondence
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.status == FOUND


def box_symmetries(size_m) -> list[np.ndarray]:
    """Rotations that map the box onto itself (signed permutations preserving the edge lengths)."""
    size = np.asarray(size_m, float)
    out = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1.0, -1.0), repeat=3):
            rotation = np.zeros((3, 3))
            rotation[np.arange(3), perm] = signs
            if np.linalg.det(rotation) > 0 and np.allclose(size[list(perm)], size, atol=1e-4):
                out.append(rotation)
    return out


def rotation_angle_rad(rotation: np.ndarray) -> float:
    return float(np.arccos(np.clip((np.trace(rotation) - 1.0) / 2.0, -1.0, 1.0)))


def symmetric_rotation_error_rad(estimate: np.ndarray, truth: np.ndarray, size_m) -> float:
    """Smallest angle between two box orientations, over the box's symmetries."""
    return min(rotation_angle_rad(estimate.T @ truth @ s) for s in box_symmetries(size_m))


def box_surface(size_m, spacing_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and outward normals on the box's six faces, in the box frame."""
    half = np.asarray(size_m, float) / 2.0
    points, normals = [], []
    for axis in range(3):
        u, v = [a for a in range(3) if a != axis]
        nu = max(2, int(math.ceil(2 * half[u] / spacing_m)) + 1)
        nv = max(2, int(math.ceil(2 * half[v] / spacing_m)) + 1)
        gu, gv = np.meshgrid(np.linspace(-half[u], half[u], nu), np.linspace(-half[v], half[v], nv))
        for sign in (1.0, -1.0):
            face = np.zeros((gu.size, 3))
            face[:, u], face[:, v], face[:, axis] = gu.ravel(), gv.ravel(), sign * half[axis]
            normal = np.zeros((gu.size, 3))
            normal[:, axis] = sign
            points.append(face)
            normals.append(normal)
    return np.vstack(points), np.vstack(normals)


class BoxTracker:
    """Stateful: keeps the last estimate to start the next frame's fit from."""

    def __init__(self, settings: BoxTrackerSettings, camera: Pinhole, world_T_camera: np.ndarray) -> None:
        self.settings = settings
        self.camera = camera
        self.world_T_camera = np.asarray(world_T_camera, float)
        if self.world_T_camera.shape != (4, 4) or not np.all(np.isfinite(self.world_T_camera)):
            raise BoxTrackingError("world_T_camera must be a finite 4x4 transform")
        self.last: np.ndarray | None = None  # the last estimate while tracking
        self.last_seen: np.ndarray | None = None  # kept through a loss
        self._good_rms: deque[float] = deque(maxlen=50)
        self._symmetries = box_symmetries(settings.size_m)
        points, normals = box_surface(settings.size_m, settings.model_spacing_m)
        self._model_points, self._model_normals = points, normals
        u, v = np.meshgrid(np.arange(camera.width), np.arange(camera.height))
        self._rays = np.stack([(u - camera.cx) / camera.fx, (v - camera.cy) / camera.fy], axis=-1)

    def reset(self) -> None:
        self.last = self.last_seen = None

    def update(self, rgb: np.ndarray, depth_mm: np.ndarray) -> BoxEstimate:
        """One frame: rgb uint8 HxWx3, depth uint16 HxW in mm (0: no return), aligned."""
        s = self.settings
        if depth_mm.shape != (self.camera.height, self.camera.width) or rgb.shape[:2] != depth_mm.shape:
            raise BoxTrackingError(f"color {rgb.shape[:2]} and depth {depth_mm.shape} must both be "
                                   f"{self.camera.height}x{self.camera.width}, as the camera_info says")
        t0 = time.perf_counter()
        world = self._candidate_points(rgb, depth_mm)
        t1 = time.perf_counter()
        if self.last is not None:
            world = world[np.linalg.norm(world[:, :2] - self.last[:2, 3], axis=1) < s.search_radius_m]
        elif s.initial_xy_m is not None:
            world = world[np.linalg.norm(world[:, :2] - np.asarray(s.initial_xy_m), axis=1) < s.initial_search_radius_m]
        world = _around_median(world, float(np.linalg.norm(s.size_m)))
        if len(world) > s.max_points:
            world = world[np.linspace(0, len(world) - 1, s.max_points).astype(int)]
        if len(world) < s.min_points:
            self.last = None
            return BoxEstimate(LOST, f"{len(world)} box points in view (at least {s.min_points} needed): "
                               "the box is out of view, hidden, or not the configured color", points=len(world),
                               timings_s={"segment": t1 - t0})
        # tracking: from the last estimate; otherwise from where it was last seen (an occluded box
        # seldom moves) and from its top face, keeping the better fit
        starts = [self.last] if self.last is not None else \
            [start for start in (self.last_seen, self._initial_guess(world)) if start is not None]
        best, reason = None, ""
        for start in starts:
            candidate, why = self._fit_from(world, start)
            if candidate is not None and (best is None or candidate.rms_m < best.rms_m):
                best = candidate
            reason = reason or why
        timings = {"segment": t1 - t0, "fit": time.perf_counter() - t1}
        if best is None:
            self.last = None
            return BoxEstimate(LOST, reason, points=len(world), timings_s=timings)
        best.timings_s = timings
        self._good_rms.append(best.rms_m)
        self.last = self.last_seen = best.world_T_box
        return best

    def _fit_from(self, world: np.ndarray, start: np.ndarray) -> tuple[BoxEstimate | None, str]:
        s = self.settings
        model_points, model_normals = self._visible_surface(start)
        world_T_box, result = self._fit(world, start, model_points, model_normals)
        rms = float(result.inlier_rmse)
        usual = float(np.median(self._good_rms)) if len(self._good_rms) >= 10 else math.inf
        if not np.isfinite(rms) or rms > min(s.max_rms_m, s.max_rms_ratio * usual) or result.fitness < 0.5:
            return None, (f"the points do not fit the box (rms {rms * 1e3:.1f} mm, usually {usual * 1e3:.1f}; "
                          f"{result.fitness:.0%} matched)")
        world_T_box[:3, :3] = self._nearest_symmetric(world_T_box[:3, :3], start[:3, :3])
        world_T_box, covariance = self._refine(world, world_T_box, np.asarray(result.correspondence_set), rms,
                                               model_points, model_normals)
        if world_T_box is None:
            return None, f"too few of the {len(world)} points fit the box well"
        return BoxEstimate(FOUND, "", world_T_box, covariance, len(world), rms, float(result.fitness)), ""

    # ------------------------------------------------------------------ steps
    def _candidate_points(self, rgb: np.ndarray, depth_mm: np.ndarray) -> np.ndarray:
        s = self.settings
        mask = depth_mm > 0
        if s.color_gate:
            hsv = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2HSV)
            hue_deg = hsv[..., 0].astype(np.float32) * 2.0
            off = np.abs((hue_deg - s.hue_deg + 180.0) % 360.0 - 180.0)
            mask &= (off <= s.hue_tolerance_deg) & (hsv[..., 1] >= s.min_saturation * 255) \
                & (hsv[..., 2] >= s.min_value * 255)
        z = depth_mm[mask].astype(np.float64) / 1000.0
        rays = self._rays[mask]
        camera_points = np.column_stack([rays[:, 0] * z, rays[:, 1] * z, z])
        world = camera_points @ self.world_T_camera[:3, :3].T + self.world_T_camera[:3, 3]
        height = world[:, 2] - s.table_height_m
        keep = (height > s.above_table_m) & (height < max(s.size_m) + s.above_box_m)
        return world[keep]

    def _initial_guess(self, world: np.ndarray) -> np.ndarray:
        """A box resting on the table: its top face's centre and its rectangle's yaw."""
        s = self.settings
        top = world[world[:, 2] > world[:, 2].max() - 0.01]
        (cx, cy), _, angle_deg = cv2.minAreaRect((top[:, :2] * 1000.0).astype(np.float32))
        yaw = math.radians(angle_deg)
        guess = np.eye(4)
        guess[:3, :3] = np.array([[math.cos(yaw), -math.sin(yaw), 0.0], [math.sin(yaw), math.cos(yaw), 0.0],
                                  [0.0, 0.0, 1.0]])
        guess[:3, 3] = [cx / 1000.0, cy / 1000.0, s.table_height_m + s.size_m[2] / 2.0]
        return guess

    def _visible_surface(self, world_T_box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model's faces that face the camera at this pose: a point near a hidden face's
        edge (the bottom's, against the table) would otherwise pull the box off its place."""
        camera_in_box = (np.linalg.inv(world_T_box) @ np.append(self.world_T_camera[:3, 3], 1.0))[:3]
        facing = np.einsum("ij,ij->i", self._model_normals, camera_in_box - self._model_points) > 0
        return self._model_points[facing], self._model_normals[facing]

    def _fit(self, world: np.ndarray, world_T_box0: np.ndarray, model_points: np.ndarray,
             model_normals: np.ndarray):
        """Coarse then fine point-to-plane ICP of the points (source) onto the box surface (target)."""
        s = self.settings
        registration = o3d.pipelines.registration
        source = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(world))
        model = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(model_points))
        model.normals = o3d.utility.Vector3dVector(model_normals)
        box_T_world = np.linalg.inv(world_T_box0)
        for distance_m, iterations in ((s.icp_coarse_distance_m, 10), (s.icp_max_distance_m, s.icp_iterations)):
            result = registration.registration_icp(
                source, model, distance_m, box_T_world,
                registration.TransformationEstimationPointToPlane(registration.TukeyLoss(k=distance_m / 2)),
                registration.ICPConvergenceCriteria(max_iteration=iterations, relative_fitness=1e-7,
                                                    relative_rmse=1e-7))
            box_T_world = np.asarray(result.transformation)
        return np.linalg.inv(box_T_world), result

    def _nearest_symmetric(self, rotation: np.ndarray, reference: np.ndarray) -> np.ndarray:
        candidates = [rotation @ sym for sym in self._symmetries]
        return min(candidates, key=lambda r: rotation_angle_rad(reference.T @ r))

    def _refine(self, world: np.ndarray, world_T_box: np.ndarray, pairs: np.ndarray, rms: float,
                model_points: np.ndarray, model_normals: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Gauss-Newton on the fit's correspondences (Tukey-weighted point-to-plane residuals)
        plus the resting prior; the covariance is the inverse of the result's information.

        The perturbation is the position and a rotation about the box's centre in world axes
        (ROS PoseWithCovariance's order). The pixel noise's sigma is the fit's residual; the
        result is scaled and floored by the numbers measured against ground truth. (None, None)
        when too few points keep a weight or the step is not small: not the box."""
        s = self.settings
        sigma2 = max(rms, 1e-4) ** 2
        pose = world_T_box.copy()
        information = np.zeros((6, 6))
        for _ in range(3):
            rotation, centre = pose[:3, :3], pose[:3, 3]
            arm = model_points[pairs[:, 1]] @ rotation.T  # model point about the centre, world axes
            normal = model_normals[pairs[:, 1]] @ rotation.T
            residual = np.einsum("ij,ij->i", normal, world[pairs[:, 0]] - centre - arm)
            k = s.icp_max_distance_m / 2
            weight = np.where(np.abs(residual) < k, (1 - (residual / k) ** 2) ** 2, 0.0)
            jacobian = -np.hstack([normal, np.cross(arm, normal)])
            information = (jacobian * weight[:, None]).T @ jacobian / sigma2
            gradient = (jacobian * weight[:, None]).T @ residual / sigma2
            if s.resting_on_table:
                prior_information, prior_gradient = self._resting_prior(pose)
                information, gradient = information + prior_information, gradient + prior_gradient
            if np.count_nonzero(weight) < s.min_points:
                return None, None
            # damped: a direction the view leaves unobserved (and no prior holds) does not move
            damping = 1e-6 * np.trace(information) / 6 * np.eye(6)
            step = -np.linalg.solve(information + damping, gradient)
            if np.linalg.norm(step[:3]) > s.icp_max_distance_m or np.linalg.norm(step[3:]) > 0.2:
                return None, None  # ICP converged: a large step here means the fit is not the box
            pose[:3, 3] += step[:3]
            pose[:3, :3] = _exp_so3(step[3:]) @ pose[:3, :3]
        # inverted by eigenvalues, each held to at least the information of "somewhere on the
        # box, any rotation", so an unobserved direction reads as large, never as negative
        values, vectors = np.linalg.eigh(0.5 * (information + information.T))
        values = np.maximum(values, 1.0 / max(float(np.sum(np.square(s.size_m))), np.pi ** 2))
        covariance = (vectors / values) @ vectors.T
        floor = np.diag([s.position_std_floor_m ** 2] * 3 + [s.rotation_std_floor_rad ** 2] * 3)
        return pose, s.covariance_scale * 0.5 * (covariance + covariance.T) + floor

    def _resting_prior(self, pose: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(information, gradient) of: centre height = table + half the down edge; that edge's axis vertical."""
        s = self.settings
        rotation = pose[:3, :3]
        down_axis = int(np.argmax(np.abs(rotation[2, :])))  # the box axis nearest world z
        up = rotation[:, down_axis] * np.sign(rotation[2, down_axis])
        height_error = pose[2, 3] - (s.table_height_m + s.size_m[down_axis] / 2.0)
        tilt_error = np.cross(np.array([0.0, 0.0, 1.0]), up)  # rotation vector from vertical to `up`
        information = np.zeros((6, 6))
        gradient = np.zeros(6)
        information[2, 2] = 1.0 / s.resting_height_std_m ** 2
        gradient[2] = height_error / s.resting_height_std_m ** 2
        for axis in (0, 1):  # tilt about world x and y
            information[3 + axis, 3 + axis] = 1.0 / s.resting_tilt_std_rad ** 2
            gradient[3 + axis] = tilt_error[axis] / s.resting_tilt_std_rad ** 2
        return information, gradient


def _exp_so3(rotation_vector: np.ndarray) -> np.ndarray:
    angle = float(np.linalg.norm(rotation_vector))
    if angle < 1e-12:
        return np.eye(3)
    k = rotation_vector / angle
    skew = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * skew + (1 - math.cos(angle)) * skew @ skew


def _around_median(points: np.ndarray, radius_m: float) -> np.ndarray:
    """The points within `radius_m` of their median (twice: a stray patch of the same color
    moves the first median)."""
    for _ in range(2):
        if len(points) == 0:
            return points
        centre = np.median(points, axis=0)
        points = points[np.linalg.norm(points - centre, axis=1) < radius_m]
    return points
