"""Hand-eye calibration with its own accuracy: OpenCV's closed forms, then a joint
reprojection refinement, a noise model fitted to the data, covariance, k-fold held-out
residuals, outlier views and a bootstrap check.

Pure Python (no rclpy). Both setups share one model,

    camera_T_target_i = inv(X) . M_i . B

- eye-in-hand (camera on the gripper): X = gripper_T_camera, M_i = inv(base_T_gripper_i),
  B = base_T_target (the fixed target);
- eye-to-hand (static camera, target on the gripper): X = base_T_camera,
  M_i = base_T_gripper_i, B = gripper_T_target.

cv2.calibrateHandEye (5 methods) and cv2.calibrateRobotWorldHandEye (2 methods) give the
initial estimates; scipy.optimize.least_squares refines X and B on image reprojection
error with a Huber loss. Robot poses are not exact: each view's gripper pose carries an
error (translation and rotation std fitted by maximum likelihood), which makes a view's
pixel residuals correlated. The refinement whitens each view's residuals with that
covariance (the per-view robot error marginalised), and the covariance of the result
comes from the whitened Jacobian. A pixel-only covariance was 9-21x too optimistic
against the bootstrap on real data; this model matched it.

The reported covariance is of (dt, dr) with X_true = [exp(dr) R, t + dt]: translation in
metres and rotation vector in radians, both in X's parent frame.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Sequence

import cv2
import numpy as np
from scipy.optimize import least_squares, minimize
from scipy.stats import chi2, norm

from twinloop_calibration import se3
from twinloop_calibration.degeneracy import (CalibrationError, DegenerateData, DiversityReport,
                                             InconsistentInput, check_precision, check_views)
from twinloop_calibration.intrinsics import CameraModel, solve_pnp
from twinloop_calibration.targets import Detection

# progress(stage, done, total): e.g. ("bootstrap", 10, 30); called as each step starts
Progress = Callable[[str, int, int], None]

HAND_EYE_METHODS = {
    "tsai": cv2.CALIB_HAND_EYE_TSAI,
    "park": cv2.CALIB_HAND_EYE_PARK,
    "horaud": cv2.CALIB_HAND_EYE_HORAUD,
    "andreff": cv2.CALIB_HAND_EYE_ANDREFF,
    "daniilidis": cv2.CALIB_HAND_EYE_DANIILIDIS,
}
ROBOT_WORLD_METHODS = {
    "rwhe_shah": cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH,
    "rwhe_li": cv2.CALIB_ROBOT_WORLD_HAND_EYE_LI,
}
HUBER_SCALE = 2.0  # whitened residual units (sigma): Huber costs ~5 % efficiency on clean data
# The target's scale is called wrong when 1 lies outside its two-sided (1 - SCALE_TEST_P)
# interval and it is off by more than SCALE_TOLERANCE: 60 sharp views tell a 0.04 % deviation
# from 1 (a rendered camera's sub-pixel effects), which no print or focal length explains and
# which moved the result by 0.04 mm, while falling back to OpenCV's estimate cost 1.8 mm.
SCALE_TEST_P = 1e-3
SCALE_TOLERANCE = 0.005
# A view is an outlier when the modified z-score of its log mean-square residual (median and
# MAD over the views, Iglewicz-Hoaglin) exceeds OUTLIER_MODIFIED_Z and, where the noise model
# holds (not at a bound), its whitened chi-square also has p < OUTLIER_TEST_P / views
# (Bonferroni): the tail of a noise model that misses something (a target's scale, lens
# distortion) is not evidence against one view.
OUTLIER_TEST_P = 1e-3
OUTLIER_MODIFIED_Z = 3.5


class Setup(str, Enum):
    EYE_IN_HAND = "eye_in_hand"
    EYE_TO_HAND = "eye_to_hand"


@dataclass(frozen=True)
class View:
    """One calibration view: the robot's gripper pose and the target found in the image."""

    base_T_gripper: np.ndarray  # 4x4, from forward kinematics at the image's time
    detection: Detection
    stamp_s: float = float("nan")
    label: str = ""


@dataclass(frozen=True)
class NoiseModel:
    pixel_std_px: float
    robot_translation_std_m: float
    robot_rotation_std_rad: float
    at_bound: bool = False  # the fit reached a plausibility bound: the error model does not hold

    def describe(self) -> str:
        return (f"pixel {self.pixel_std_px:.3f} px, robot pose {self.robot_translation_std_m * 1e3:.3f} mm / "
                f"{math.degrees(self.robot_rotation_std_rad):.4f} deg"
                + (" (at its plausibility bound: covariance from the per-view jackknife)" if self.at_bound else ""))


# One set of precision limits (1 sigma) for the API, `twinloop calibrate` and the calibration
# server (config/calibration.yaml): a result less certain than this is refused.
MAX_TRANSLATION_STD_M = 0.01
MAX_ROTATION_STD_DEG = 1.0


@dataclass(frozen=True)
class ScaleCheck:
    """The target's scale the robot's metric motion implies: 1 when the target measures as
    described and the focal length is right. A board printed at the wrong size and a focal
    length off by the same factor look alike in the images; the message names both."""

    scale: float
    std: float
    p_value: float  # of scale == 1, two-sided
    anomalous: bool  # p_value < SCALE_TEST_P and |scale - 1| > SCALE_TOLERANCE
    transform: np.ndarray  # X re-solved with the scale free
    target_transform: np.ndarray
    covariance: np.ndarray  # 6x6 of `transform`
    full_covariance: np.ndarray  # of every unknown transform (the scale left out)
    applied: bool = False  # the result is the scale-corrected solution
    fallback: str = ""  # else, when anomalous: the OpenCV method whose estimate the result is
    problem: object = field(default=None, repr=False, compare=False)  # the scale-free refinement (its bootstrap)
    noise: NoiseModel | None = None  # of the scale-free refinement
    whitened: bool = False  # the scale-free refinement is the robot-noise one

    def describe(self, spacing_m: float | None = None) -> str:
        size = (f"the target's spacing measures {self.scale * spacing_m * 1e3:.2f} +- {self.std * spacing_m * 1e3:.2f} mm, "
                f"not {spacing_m * 1e3:.2f} mm" if spacing_m else "")
        text = f"target scale {self.scale:.4f} +- {self.std:.4f} (p = {self.p_value:.2g} that it is 1)"
        if not self.anomalous:
            return text + (": consistent with the target description and the focal length"
                           if self.p_value >= SCALE_TEST_P else
                           f": within {SCALE_TOLERANCE:.1%} of the target description, not flagged")
        return (f"{text}: {size + ': ' if size else ''}check the target's print (its scale) and description, "
                f"or the focal length (one given {1.0 / self.scale:.4f} times the true one looks the same)"
                + ("; the result is the scale-corrected solution" if self.applied else
                   (f"; the result is OpenCV's {self.fallback} estimate (its rotation does not depend on the "
                    "target's scale; the refinement would trade rotation for it)" if self.fallback else "")
                   + "; the scale-corrected solution is offered (--correct-scale / Options.correct_scale)"))


@dataclass(frozen=True)
class Outlier:
    """A view left out, with the test that rejected it."""

    index: int  # into the input views
    label: str  # the image's name where the views came from files
    rms_px: float
    test: str
    statistic: float
    threshold: float

    def describe(self) -> str:
        return (f"{self.label or self.index}: {self.rms_px:.2f} px RMS, {self.test} {self.statistic:.1f} "
                f"> {self.threshold:.1f}")


@dataclass(frozen=True)
class Options:
    min_views: int = 5
    min_rotation_spread_deg: float = 3.0
    folds: int = 5  # k of the k-fold held-out residual (0: none)
    bootstrap: int = 0  # bootstrap resamples checking the covariance (0: none)
    reject_outliers: bool = True
    max_rejected_fraction: float = 0.3
    max_translation_std_m: float = MAX_TRANSLATION_STD_M  # refuse a result less certain than this (1 sigma)
    max_rotation_std_deg: float = MAX_ROTATION_STD_DEG
    correct_scale: bool = False  # when the target's scale is found wrong, return the solution with it corrected
    estimate_robot_noise: bool = True
    fixed_noise: NoiseModel | None = None  # use these noise levels instead of fitting them
    # Plausible robot pose error (1 sigma). A fit that reaches a bound means the residuals hold
    # more than pixel noise and robot pose error (e.g. wrong intrinsics); the covariance then
    # comes from the jackknife over the views, which assumes no error model.
    max_robot_translation_std_m: float = 0.005
    max_robot_rotation_std_deg: float = 0.5
    seed: int = 0


@dataclass
class HandEyeResult:
    setup: Setup
    transform: np.ndarray  # gripper_T_camera (eye-in-hand) or base_T_camera (eye-to-hand)
    target_transform: np.ndarray  # base_T_target (eye-in-hand) or gripper_T_target (eye-to-hand)
    covariance: np.ndarray  # 6x6 of `transform`, (dt, dr): m, rad
    target_covariance: np.ndarray
    method: str  # "refined_robot_noise" where the noise model holds; else "refined" or "opencv_<name>" by held-out residual
    reprojection_rms_px: float
    held_out_rms_px: float
    held_out_rms_px_by_candidate: dict[str, float]
    per_view_rms_px: list[float]
    rejected_views: list[int]  # indices into the input views
    noise: NoiseModel
    diversity: DiversityReport
    opencv: dict[str, np.ndarray] = field(default_factory=dict)  # X of every OpenCV method
    refined_transform: np.ndarray | None = None
    bootstrap_covariance: np.ndarray | None = None
    views_used: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    scale_check: ScaleCheck | None = None
    outliers: list[Outlier] = field(default_factory=list)

    @property
    def std(self) -> tuple[float, float]:
        """(translation std in m, rotation std in rad): sqrt of the largest eigenvalue of each block."""
        return (float(np.sqrt(np.linalg.eigvalsh(self.covariance[:3, :3])[-1])),
                float(np.sqrt(np.linalg.eigvalsh(self.covariance[3:, 3:])[-1])))

    @property
    def bootstrap_ratio(self) -> tuple[float, float] | None:
        """sqrt(trace) of the analytic over the bootstrap covariance, translation and rotation."""
        if self.bootstrap_covariance is None:
            return None
        b = self.bootstrap_covariance
        return (float(np.sqrt(np.trace(self.covariance[:3, :3]) / np.trace(b[:3, :3]))),
                float(np.sqrt(np.trace(self.covariance[3:, 3:]) / np.trace(b[3:, 3:]))))


# ----------------------------------------------------------------------------- the model

@dataclass
class _Group:
    """Views seen by one camera, sharing the unknowns `x` (carrier_T_camera) and `b`."""

    camera: CameraModel
    x: str
    b: str
    middle: list[np.ndarray]  # M_i
    detections: list[Detection]
    perturb: str | None  # where the robot pose error enters: "left" or "right" of M_i, None: no robot
    pixel_std: float | None = None  # the group's own pixel noise (a fixed camera's averaged view); None: fitted


def _stack(group: _Group) -> tuple:
    """A group's views as arrays for batched prediction: middles (V, 4, 4), each view's
    object points (a list), image points (P, 2), residual bounds (V + 1,)."""
    if not group.middle:
        return ()
    counts = [len(d.object_points) for d in group.detections]
    return (np.stack(group.middle), [d.object_points for d in group.detections],
            np.concatenate([d.image_points for d in group.detections]),
            2 * np.concatenate([[0], np.cumsum(counts)]).astype(int))


def _middle(setup: Setup, base_T_gripper: np.ndarray) -> np.ndarray:
    return se3.inv(base_T_gripper) if setup == Setup.EYE_IN_HAND else base_T_gripper


def _group(setup: Setup, views: Sequence[View], camera: CameraModel) -> _Group:
    return _Group(camera, "x", "b", [_middle(setup, v.base_T_gripper) for v in views],
                  [v.detection for v in views], "left" if setup == Setup.EYE_IN_HAND else "right")


class _ViewCovariance:
    """One view's residual covariance s^2 I + A A^T (A: 2N x 6, the robot pose error's
    effect scaled by its std), kept low-rank: a view of a 24x17 chessboard has 816
    residuals, and a dense inverse square root per view cost seconds per solve.

    `w @ r` applies the symmetric inverse square root, so |w @ r|^2 = r' Sigma^-1 r."""

    def __init__(self, pixel_std: float, effect: np.ndarray) -> None:
        self.pixel_std = pixel_std
        self.basis, singular, _ = np.linalg.svd(effect, full_matrices=False)
        self.variances = singular ** 2  # of the robot error along `basis`, on top of s^2
        self.gain = 1.0 / np.sqrt(pixel_std ** 2 + self.variances) - 1.0 / pixel_std

    def __matmul__(self, r: np.ndarray) -> np.ndarray:
        return r / self.pixel_std + self.basis @ (self.gain * (self.basis.T @ r))

    def sandwich(self, jac: np.ndarray) -> np.ndarray:
        """J' Sigma J without forming Sigma."""
        projected = self.basis.T @ jac
        return self.pixel_std ** 2 * (jac.T @ jac) + projected.T @ (self.variances[:, None] * projected)


class _Problem:
    """The unknown transforms (6 each, a perturbation of `reference`) and, with
    `estimate_scale`, one more: the target's scale (its points as described, times
    `scale`), which the robot's metric motion makes observable."""

    def __init__(self, groups: list[_Group], reference: dict[str, np.ndarray], *,
                 scale: float = 1.0, estimate_scale: bool = False) -> None:
        self.groups = groups
        self.names = list(reference)
        self.reference = reference
        self.scale = scale
        self.estimate_scale = estimate_scale
        self.whiteners: list[list[_ViewCovariance | None]] = [[None] * len(g.middle) for g in groups]
        self.pixel_scale = 1.0
        self._stacks = [_stack(g) for g in groups]

    @property
    def size(self) -> int:
        return 6 * len(self.names) + int(self.estimate_scale)

    def transforms(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        return {name: se3.perturb(self.reference[name], theta[6 * k:6 * k + 6])
                for k, name in enumerate(self.names)}

    def scale_of(self, theta: np.ndarray) -> float:
        return self.scale * (1.0 + theta[6 * len(self.names)]) if self.estimate_scale else self.scale

    @staticmethod
    def predict(transforms: dict[str, np.ndarray], group: _Group, index: int,
                robot_delta: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
        middle = group.middle[index]
        if robot_delta is not None:
            error = se3.from_rotvec(robot_delta[3:], robot_delta[:3])
            middle = error @ middle if group.perturb == "left" else middle @ error
        camera_T_target = se3.inv(transforms[group.x]) @ middle @ transforms[group.b]
        points = (scale * group.detections[index].object_points) @ camera_T_target[:3, :3].T + camera_T_target[:3, 3]
        return group.camera.project(points)

    def view_residual(self, transforms, group_index: int, index: int) -> np.ndarray:
        group = self.groups[group_index]
        return (self.predict(transforms, group, index, scale=self.scale)
                - group.detections[index].image_points).ravel()

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        """Every view's residual (view_residual, whitened), in view order. The views of a
        group are predicted together (one batched transform and projection): the solver
        and its finite differences call this thousands of times per calibration."""
        transforms = self.transforms(theta)
        scale = self.scale_of(theta)
        out = []
        for g, group in enumerate(self.groups):
            if not group.middle:
                continue
            middle, points, image, bounds = self._stacks[g]
            camera_T_target = se3.inv(transforms[group.x]) @ middle @ transforms[group.b]
            camera_points = np.concatenate([(scale * p) @ t[:3, :3].T + t[:3, 3]
                                            for p, t in zip(points, camera_T_target)])
            r = (group.camera.project(camera_points) - image).ravel()
            whiteners = self.whiteners[g]
            if all(w is None for w in whiteners):
                out.append(r / self.pixel_scale)
                continue
            out.extend(w @ r[a:b] if w is not None else r[a:b] / self.pixel_scale
                       for w, a, b in zip(whiteners, bounds[:-1], bounds[1:]))
        return np.concatenate(out)

    def robot_jacobian(self, transforms, g: int, i: int, step: float = 1e-6) -> np.ndarray:
        """d(pixels)/d(robot pose error) of one view (2N x 6), central differences."""
        group = self.groups[g]
        columns = []
        for k in range(6):
            delta = np.zeros(6)
            delta[k] = step
            columns.append((self.predict(transforms, group, i, delta, self.scale)
                            - self.predict(transforms, group, i, -delta, self.scale)).ravel() / (2 * step))
        return np.column_stack(columns)

    def view_covariance(self, transforms, g: int, i: int, noise: NoiseModel) -> _ViewCovariance:
        """Sigma_i = s^2 I + G_i S G_i^T: pixel noise plus the view's robot pose error."""
        group = self.groups[g]
        n = 2 * len(group.detections[i])
        pixel = noise.pixel_std_px if group.pixel_std is None else group.pixel_std
        if group.perturb is None:
            return _ViewCovariance(pixel, np.zeros((n, 0)))
        prior = np.array([noise.robot_translation_std_m] * 3 + [noise.robot_rotation_std_rad] * 3)
        return _ViewCovariance(pixel, self.robot_jacobian(transforms, g, i) * prior)

    def set_noise(self, transforms, noise: NoiseModel | None) -> None:
        """Whiten every view's residuals with its Sigma_i (None: plain pixels)."""
        for g, group in enumerate(self.groups):
            for i in range(len(group.middle)):
                self.whiteners[g][i] = None if noise is None else self.view_covariance(transforms, g, i, noise)

    def solve(self, theta0: np.ndarray | None = None, *, robust: bool = True) -> np.ndarray:
        theta0 = np.zeros(self.size) if theta0 is None else theta0
        result = least_squares(self.residuals, theta0, method="trf", x_scale="jac",
                               loss="huber" if robust else "linear", f_scale=HUBER_SCALE,
                               xtol=1e-12, ftol=1e-12, gtol=1e-10, max_nfev=200)
        return result.x

    def recentre(self, theta: np.ndarray) -> None:
        self.reference = self.transforms(theta)
        self.scale = self.scale_of(theta)

    def jacobian(self, step: float = 1e-7) -> np.ndarray:
        theta = np.zeros(self.size)
        base = self.residuals(theta)
        columns = []
        for k in range(len(theta)):
            d = theta.copy()
            d[k] = step
            columns.append((self.residuals(d) - base) / step)
        return np.column_stack(columns)


def _fit_noise(problem: _Problem, *, robot: bool, max_translation_m: float = 0.005,
               max_rotation_rad: float = math.radians(0.5)) -> NoiseModel:
    """Maximum-likelihood pixel and robot-pose noise levels from the residuals at the estimate
    (of the groups without their own pixel noise)."""
    transforms = problem.reference
    stats = []
    fitted = [g for g, group in enumerate(problem.groups) if group.pixel_std is None]
    unknowns = 6 * len({n for g in fitted for n in (problem.groups[g].x, problem.groups[g].b)})
    for g in fitted:
        group = problem.groups[g]
        for i in range(len(group.middle)):
            r = problem.view_residual(transforms, g, i)
            jac = problem.robot_jacobian(transforms, g, i) if (robot and group.perturb) else np.zeros((len(r), 6))
            stats.append((len(r), r @ r, jac.T @ r, jac.T @ jac))
    total = sum(s[0] for s in stats)
    dof_correction = total / max(1, total - unknowns - int(problem.estimate_scale))
    counts = np.array([s[0] for s in stats], dtype=float)
    rr = np.array([s[1] for s in stats])
    gr = np.array([s[2] for s in stats])
    gg = np.array([s[3] for s in stats])

    def nll(log_params: np.ndarray) -> float:
        # Woodbury: Sigma = s2 I + G S G', all views at once
        s2 = math.exp(2 * log_params[0])
        prior = np.array([math.exp(2 * log_params[1])] * 3 + [math.exp(2 * log_params[2])] * 3)
        inner = gg + np.diag(s2 / prior)
        _, logdet_inner = np.linalg.slogdet(inner)
        logdet = counts * math.log(s2) + logdet_inner + np.sum(np.log(prior)) - 6 * math.log(s2)
        quad = (rr - np.einsum("vi,vi->v", gr, np.linalg.solve(inner, gr[..., None])[..., 0])) / s2
        return float(np.sum(logdet + quad))

    pixel0 = math.sqrt(sum(s[1] for s in stats) / total)
    if not robot:
        return NoiseModel(pixel0 * math.sqrt(dof_correction), 0.0, 0.0)
    start = np.log([max(pixel0, 1e-3), 1e-4, 1e-4])
    start = np.minimum(start, [math.log(100.0), math.log(max_translation_m), math.log(max_rotation_rad)])
    bounds = [(math.log(1e-3), math.log(100.0)), (math.log(1e-7), math.log(max_translation_m)),
              (math.log(1e-7), math.log(max_rotation_rad))]
    best = minimize(nll, start, method="L-BFGS-B", bounds=bounds)
    pixel, translation, rotation = np.exp(best.x)
    at_bound = translation > 0.98 * max_translation_m or rotation > 0.98 * max_rotation_rad
    return NoiseModel(float(pixel * math.sqrt(dof_correction)), float(translation), float(rotation), at_bound)


# ----------------------------------------------------------------------------- OpenCV

def opencv_estimates(setup: Setup, views: Sequence[View], camera: CameraModel,
                     methods: Sequence[str] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{method: (X, B)} from OpenCV's five hand-eye and two robot-world-hand-eye methods
    (`methods`: only these)."""
    camera_T_target = [solve_pnp(v.detection, camera) for v in views]
    middle = [_middle(setup, v.base_T_gripper) for v in views]
    carrier = [se3.inv(m) for m in middle]  # "gripper2base" in OpenCV's words
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, method in HAND_EYE_METHODS.items():
        if methods is not None and name not in methods:
            continue
        try:
            rotation, translation = cv2.calibrateHandEye(
                [c[:3, :3] for c in carrier], [c[:3, 3] for c in carrier],
                [t[:3, :3] for t in camera_T_target], [t[:3, 3] for t in camera_T_target], method=method)
        except cv2.error:
            continue
        x = se3.make(rotation, translation)
        if not _proper(x):
            continue
        b = se3.mean([se3.inv(m) @ x @ t for m, t in zip(middle, camera_T_target)])
        out[name] = (x, b)
    for name, method in ROBOT_WORLD_METHODS.items():
        if methods is not None and name not in methods:
            continue
        try:
            r_bw, t_bw, r_gc, t_gc = cv2.calibrateRobotWorldHandEye(
                [t[:3, :3] for t in camera_T_target], [t[:3, 3:4].copy() for t in camera_T_target],
                [m[:3, :3] for m in middle], [m[:3, 3:4].copy() for m in middle], method=method)
        except cv2.error:
            continue
        x, b = se3.inv(se3.make(r_gc, t_gc)), se3.inv(se3.make(r_bw, t_bw))
        if _proper(x) and _proper(b):
            out[name] = (x, b)
    return out


def _proper(transform: np.ndarray) -> bool:
    """A finite rigid transform (some OpenCV methods return reflections on inconsistent data)."""
    return bool(np.all(np.isfinite(transform)) and np.linalg.det(transform[:3, :3]) > 0.5)


def reprojection_rms(setup: Setup, views: Sequence[View], camera: CameraModel, x: np.ndarray,
                     b: np.ndarray, *, scale: float = 1.0) -> tuple[float, list[float]]:
    group = _group(setup, views, camera)
    transforms = {"x": x, "b": b}
    per_view, total, count = [], 0.0, 0
    for i in range(len(views)):
        r = (_Problem.predict(transforms, group, i, scale=scale) - group.detections[i].image_points)
        squared = float(np.sum(r ** 2))
        per_view.append(math.sqrt(squared / len(r)))
        total += squared
        count += len(r)
    return math.sqrt(total / max(1, count)), per_view


# ----------------------------------------------------------------------------- solving

@dataclass
class _Fit:
    pixel: _Problem  # reprojection refinement, every point weighted alike (robust loss)
    whitened: _Problem  # the same with each view's robot pose error marginalised
    noise: NoiseModel
    opencv: dict[str, tuple[np.ndarray, np.ndarray]]
    best_opencv: str
    setup: Setup = Setup.EYE_IN_HAND

    def problem(self, candidate: str) -> _Problem:
        """The refinement a refined candidate came from (OpenCV's shares the pixel one's unknowns)."""
        return self.whitened if candidate == "refined_robot_noise" else self.pixel

    def opencv_again(self, views: Sequence[View]) -> tuple[np.ndarray, np.ndarray] | None:
        """(X, B) of the best OpenCV method on other views (a jackknife or bootstrap sample)."""
        return opencv_estimates(self.setup, views, self.pixel.groups[0].camera,
                                methods=(self.best_opencv,)).get(self.best_opencv)

    def candidates(self) -> dict[str, dict[str, np.ndarray]]:
        x, b = self.opencv[self.best_opencv]
        return {"refined": dict(self.pixel.reference), "refined_robot_noise": dict(self.whitened.reference),
                "opencv": {**self.pixel.reference, "x": x, "b": b}}


def _initial(setup: Setup, views: Sequence[View], camera: CameraModel):
    candidates = opencv_estimates(setup, views, camera)
    if not candidates:
        raise DegenerateData("every OpenCV hand-eye method failed on these views; check that the robot "
                             "poses and images belong together and that the gripper rotates between views")
    scores = {name: reprojection_rms(setup, views, camera, x, b)[0] for name, (x, b) in candidates.items()}
    best = min(scores, key=scores.get)
    return candidates, best


def _fit(setup: Setup, views: Sequence[View], camera: CameraModel, options: Options,
         extra_groups: Sequence[_Group] = (), extra_start: dict[str, np.ndarray] | None = None, *,
         estimate_scale: bool = False, warm: _Fit | None = None) -> _Fit:
    """The pixel-weighted and the whitened refinements with the noise model fitted between
    them; `warm`: start from this fit's estimates (same views) instead of OpenCV's."""
    if warm is not None:
        candidates, best = warm.opencv, warm.best_opencv
        start = dict(warm.pixel.reference)
    else:
        candidates, best = _initial(setup, views, camera)
        start = {"x": candidates[best][0], "b": candidates[best][1], **(extra_start or {})}
    groups = [_group(setup, views, camera), *extra_groups]
    pixel = _Problem(groups, start, estimate_scale=estimate_scale)
    pixel.recentre(pixel.solve())
    robot = options.estimate_robot_noise and any(g.perturb for g in groups)
    bounds = {"max_translation_m": options.max_robot_translation_std_m,
              "max_rotation_rad": math.radians(options.max_robot_rotation_std_deg)}
    noise = options.fixed_noise or _fit_noise(pixel, robot=robot, **bounds)
    whitened = _Problem(groups, dict(pixel.reference), scale=pixel.scale, estimate_scale=estimate_scale)
    whitened.set_noise(whitened.reference, noise)
    whitened.recentre(whitened.solve())
    if options.fixed_noise is None:
        noise = _fit_noise(whitened, robot=robot, **bounds)
    whitened.set_noise(whitened.reference, noise)
    return _Fit(pixel, whitened, noise, candidates, best, setup)


def _covariance(fit: _Fit, candidate: str, views: Sequence[View] = ()) -> tuple[np.ndarray, str]:
    """Covariance of all unknowns and the model it came from.

    - noise model holds: for the robot-noise estimate the inverse whitened Gauss-Newton
      Hessian; for pixel-weighted estimates the sandwich H^-1 (sum J_i' Sigma_i J_i) H^-1
      with each view's residual covariance Sigma_i from the noise model;
    - noise model at a bound (misspecified): the jackknife over the views (_jackknife),
      which assumes no error model;
    - OpenCV's estimate (no model of its own): the jackknife of that method over `views`.
    """
    if candidate == "opencv":
        return _opencv_jackknife(fit, views), "opencv_jackknife"
    return _problem_covariance(fit.problem(candidate), fit.noise, whitened=candidate == "refined_robot_noise")


def _problem_covariance(problem: _Problem, noise: NoiseModel, *, whitened: bool,
                        one_step: bool = False) -> tuple[np.ndarray, str]:
    """_covariance of one problem: `whitened` when its residuals are whitened by `noise`;
    `one_step`: a quick jackknife where the noise model does not hold (see _jackknife)."""
    if noise.at_bound:
        return _jackknife(problem, one_step=one_step), "per_view_jackknife"
    jac = problem.jacobian()
    hessian_inv = np.linalg.pinv(jac.T @ jac)
    # Small-sample correction: the two unknown transforms absorb about two views' worth of
    # robot pose error, so the fitted noise levels are low by about G / (G - 2).
    robot_views = sum(len(g.middle) for g in problem.groups if g.perturb)
    small_sample = robot_views / max(1, robot_views - 2)
    if whitened:
        return hessian_inv * small_sample, "robot_pose_error_model"
    meat = np.zeros_like(hessian_inv)
    row = 0
    for g, group in enumerate(problem.groups):
        for i in range(len(group.middle)):
            n = 2 * len(group.detections[i])
            meat += problem.view_covariance(problem.reference, g, i, noise).sandwich(jac[row:row + n])
            row += n
    return hessian_inv @ meat @ hessian_inv * small_sample, "robot_pose_error_model_sandwich"


def _intrinsics_covariance(problem: _Problem, camera: CameraModel) -> np.ndarray:
    """What the intrinsics' own uncertainty adds to the unknowns' covariance, when they were
    calibrated from the same views (camera.intrinsics_std: fx, fy, cx, cy, k1, k2, p1, p2,
    k3, taken as independent; cv2 gives no correlations): the estimate's shift per 1-sigma
    of each, -(J'J)^-1 J' dr/dk. Measured on rendered chessboard views with intrinsics from
    the same 15 views: 1.46 mm from the truth against a reported 0.40 mm without this term."""
    jac = problem.jacobian()
    zero = np.zeros(jac.shape[1])
    base = problem.residuals(zero)
    shifts = []
    for k, std in enumerate(camera.intrinsics_std[:9]):
        if not std > 0:
            continue
        matrix, distortion = camera.camera_matrix.copy(), camera.distortion.copy()
        if k < 4:
            matrix[(0, 1, 0, 1)[k], (0, 1, 2, 2)[k]] += std
        else:
            distortion[k - 4] += std
        moved = replace(camera, camera_matrix=matrix, distortion=distortion)
        perturbed = _Problem([replace(g, camera=moved) if g.camera is camera else g for g in problem.groups],
                             problem.reference, scale=problem.scale, estimate_scale=problem.estimate_scale)
        perturbed.whiteners, perturbed.pixel_scale = problem.whiteners, problem.pixel_scale
        shifts.append(-np.linalg.lstsq(jac, perturbed.residuals(zero) - base, rcond=None)[0])
    if not shifts:
        return np.zeros((jac.shape[1], jac.shape[1]))
    shifts = np.array(shifts)
    return shifts.T @ shifts


def _subset(problem: _Problem, keep: Sequence[int]) -> _Problem:
    """The problem on the views `keep` of its first group (the others whole), same weights."""
    group = problem.groups[0]
    sample = replace(group, middle=[group.middle[i] for i in keep], detections=[group.detections[i] for i in keep])
    out = _Problem([sample, *problem.groups[1:]], dict(problem.reference), scale=problem.scale,
                   estimate_scale=problem.estimate_scale)
    out.whiteners = [[problem.whiteners[0][i] for i in keep], *problem.whiteners[1:]]
    out.pixel_scale = problem.pixel_scale
    return out


def _jackknife(problem: _Problem, *, one_step: bool = False) -> np.ndarray:
    """Covariance of every unknown from the estimate solved again without each view in turn
    (the jackknife, (G - 1) / G * sum (d_i - mean)(d_i - mean)').

    Used where the noise model does not hold. The per-view (cluster-robust) sandwich it
    replaces was 0.46-0.60x a bootstrap over the views in translation on the real 10x10 set
    (15 views; the sandwich is known to run low with few clusters); the jackknife was
    0.8-1.3x, and on synthetic views where the model holds it agrees with the analytic
    covariance within 1.3x. It costs one warm-started solve per view (0.7-7 s for the 15
    views of the 10x10 set). `one_step`: each d_i one Gauss-Newton step from the estimate on
    the other views' Huber-weighted residuals instead, at the cost of the Jacobian alone;
    within 0.6-1.1x of the solved ones on the 10x10 set, for the scale check's test."""
    if not one_step:
        count = len(problem.groups[0].middle)
        deltas = [_subset(problem, [k for k in range(count) if k != i]).solve() for i in range(count)]
    else:
        jac = problem.jacobian()
        residuals = problem.residuals(np.zeros(jac.shape[1]))
        # least_squares' Huber loss as weights: 1 inside HUBER_SCALE, HUBER_SCALE / |r| outside
        weights = np.sqrt(np.minimum(1.0, HUBER_SCALE / np.maximum(np.abs(residuals), 1e-12)))
        jac, residuals = jac * weights[:, None], residuals * weights
        hessian, gradient = jac.T @ jac, jac.T @ residuals
        deltas, row = [], 0
        for detection in problem.groups[0].detections:
            rows = slice(row, row + 2 * len(detection))
            block, r = jac[rows], residuals[rows]
            deltas.append(-np.linalg.lstsq(hessian - block.T @ block, gradient - block.T @ r, rcond=None)[0])
            row = rows.stop
    count = len(deltas)
    centred = np.array(deltas) - np.mean(deltas, axis=0)
    return (count - 1) / count * centred.T @ centred


def _opencv_jackknife(fit: _Fit, views: Sequence[View]) -> np.ndarray:
    """Covariance of OpenCV's estimate (X, then B: the refinement's first two unknowns) by the
    jackknife of the same method over the views (milliseconds a solve)."""
    x, b = fit.opencv[fit.best_opencv]
    deltas = []
    for i in range(len(views)):
        estimate = fit.opencv_again([v for k, v in enumerate(views) if k != i])
        if estimate is not None:
            deltas.append(np.concatenate([se3.difference(estimate[0], x), se3.difference(estimate[1], b)]))
    count = len(deltas)
    centred = np.array(deltas) - np.mean(deltas, axis=0)
    covariance = np.zeros((fit.pixel.size, fit.pixel.size))
    covariance[:12, :12] = (count - 1) / max(1, count) * centred.T @ centred
    return covariance


def _scale_check(setup: Setup, views: Sequence[View], camera: CameraModel, options: Options, fit: _Fit,
                 chosen: str) -> ScaleCheck:
    """The whole fit again with the target's scale free (its own noise model: a wrong scale
    otherwise reads as robot pose error); test scale == 1."""
    free = _fit(setup, views, camera, options, estimate_scale=True, warm=fit)
    whitened = chosen == "refined_robot_noise"
    problem = free.problem(chosen)
    # the quick jackknife for the test; a result that takes the corrected solution gets the solved one (_finish)
    covariance, _ = _problem_covariance(problem, free.noise, whitened=whitened, one_step=True)
    k = 6 * len(problem.names)
    std = float(np.sqrt(max(covariance[k, k], 0.0))) * problem.scale
    p_value = float(2 * norm.sf(abs(problem.scale - 1.0) / std)) if std > 0 else 0.0
    anomalous = p_value < SCALE_TEST_P and abs(problem.scale - 1.0) > SCALE_TOLERANCE
    return ScaleCheck(problem.scale, std, p_value, anomalous, problem.reference["x"],
                      problem.reference["b"], covariance[:6, :6], covariance[:k, :k], problem=problem,
                      noise=free.noise, whitened=whitened)


def _folds(count: int, k: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(count)
    return [order[f::k] for f in range(k)]


def _held_out(setup, views, camera, options, extra_groups, extra_start,
              progress: Progress = lambda stage, done, total: None) -> dict[str, float]:
    """Held-out reprojection RMS (px) of each candidate estimate over k folds of the views."""
    k = min(options.folds, len(views))
    sums: dict[str, list[float]] = {}
    for fold, held in enumerate(_folds(len(views), k, options.seed)):
        progress("held-out folds", fold, k)
        train = [v for i, v in enumerate(views) if i not in set(held)]
        test = [views[i] for i in held]
        try:
            fit = _fit(setup, train, camera, options, extra_groups, extra_start)
        except (CalibrationError, np.linalg.LinAlgError):
            continue
        for name, transforms in fit.candidates().items():
            _, per_view = reprojection_rms(setup, test, camera, transforms["x"], transforms["b"])
            total = sums.setdefault(name, [0.0, 0])
            for v, rms in zip(test, per_view):
                total[0] += rms ** 2 * len(v.detection)
                total[1] += len(v.detection)
    return {name: math.sqrt(total / count) if count else float("nan") for name, (total, count) in sums.items()}


def _outliers(problem: _Problem, noise: NoiseModel, labels: Sequence[str], group_index: int = 0) -> list[Outlier]:
    """Views whose residual is improbable under the fitted noise model (see OUTLIER_TEST_P and
    OUTLIER_MODIFIED_Z for the tests)."""
    group = problem.groups[group_index]
    count = len(group.middle)
    residuals = [problem.view_residual(problem.reference, group_index, i) for i in range(count)]
    rms = [float(np.sqrt(np.mean(r ** 2) * 2)) for r in residuals]
    out = []
    log_ms = np.log(np.maximum(np.array(rms), 1e-12) ** 2)
    mad = float(np.median(np.abs(log_ms - np.median(log_ms))))
    z = 0.6745 * (log_ms - np.median(log_ms)) / max(mad, 1e-12)
    if noise.at_bound:
        for i in np.nonzero(z > OUTLIER_MODIFIED_Z)[0]:
            out.append(Outlier(int(i), labels[i], rms[i], "modified z of log mean-square residual", float(z[i]),
                               OUTLIER_MODIFIED_Z))
        return out
    stats = []
    for i in range(count):
        r = problem.whiteners[group_index][i] @ residuals[i]
        stats.append((float(r @ r), len(r)))
    normalised = np.array([s / n for s, n in stats])
    scale = max(1.0, float(np.median(normalised)))
    for i, (s, n) in enumerate(stats):
        threshold = float(chi2.isf(OUTLIER_TEST_P / count, n))
        if s / scale > threshold and z[i] > OUTLIER_MODIFIED_Z:
            out.append(Outlier(i, labels[i], rms[i], f"whitened chi-square ({n} dof)", s / scale, threshold))
    return out


def calibrate(setup: Setup | str, views: Sequence[View], camera: CameraModel,
              options: Options = Options(), *, progress: Progress = lambda stage, done, total: None) -> HandEyeResult:
    """Hand-eye calibration of `views` (see the module docstring for the frames)."""
    setup = Setup(setup)
    views = list(views)
    progress("fitting", 0, len(views))
    diversity = check_views([v.base_T_gripper for v in views], min_views=options.min_views,
                            min_rotation_spread_deg=options.min_rotation_spread_deg)
    kept = list(range(len(views)))
    fit = _fit(setup, views, camera, options)
    rejected: list[int] = []
    outliers: list[Outlier] = []
    if options.reject_outliers:
        outliers = _outliers(fit.whitened, fit.noise, [v.label or str(i) for i, v in enumerate(views)])
        bad = [o.index for o in outliers]
        if bad:
            if len(bad) > options.max_rejected_fraction * len(views):
                raise DegenerateData(
                    f"{len(bad)} of {len(views)} views disagree with the rest "
                    f"({'; '.join(o.describe() for o in outliers)}); check the camera/robot time sync, "
                    "the intrinsics and the target description before retrying")
            rejected = bad
            kept = [i for i in kept if i not in rejected]
            views_kept = [views[i] for i in kept]
            check_views([v.base_T_gripper for v in views_kept], min_views=options.min_views,
                        min_rotation_spread_deg=options.min_rotation_spread_deg)
            progress("refitting without outliers", 0, len(views_kept))
            fit = _fit(setup, views_kept, camera, options)
    used = [views[i] for i in kept]
    result = _finish(setup, used, camera, options, fit, rejected, diversity, progress)
    result.outliers = outliers
    return result


def _choose(held: dict[str, float]) -> str:
    finite = {name: value for name, value in held.items() if math.isfinite(value)}
    return min(finite, key=finite.get) if finite else "refined_robot_noise"


def _finish(setup, used, camera, options, fit: _Fit, rejected, diversity,
            progress: Progress = lambda stage, done, total: None) -> HandEyeResult:
    held = _held_out(setup, used, camera, options, (), None, progress) if options.folds >= 2 else {}
    # Where the noise model holds, the robot-noise refinement is its maximum-likelihood
    # estimate: choosing among the candidates by a held-out residual of a few views each
    # added variance the covariance does not hold (synthetic, 20 seeds of 12 views: mean
    # error 1.09 mm / 0.205 deg against 1.01 mm / 0.171 deg; a bootstrap over the views
    # switched candidates in 8-12 of 20 resamples). Where it does not, the held-out residual chooses.
    ml = options.estimate_robot_noise and not fit.noise.at_bound and "refined_robot_noise" in held
    chosen = "refined_robot_noise" if ml else _choose(held)
    covariance, covariance_model = _covariance(fit, chosen, used)
    transforms = fit.candidates()[chosen]
    progress("scale check", 0, 1)
    scale = _scale_check(setup, used, camera, options, fit, chosen)
    scale_applied = scale.anomalous and options.correct_scale
    if scale_applied:
        full, _ = _problem_covariance(scale.problem, scale.noise, whitened=scale.whitened)
        k = 6 * len(scale.problem.names)
        scale = replace(scale, applied=True, full_covariance=full[:k, :k], covariance=full[:6, :6])
        covariance, covariance_model = scale.full_covariance, covariance_model + "_scale_free"
        transforms = {"x": scale.transform, "b": scale.target_transform}
    elif scale.anomalous and chosen != "opencv":
        # The refinement's model (the target as described) is wrong: it absorbs the scale by
        # trading rotation for translation (real 10x10 set, intrinsics from the same views:
        # leave-one-out 16.4 mm / 1.48 deg against OpenCV's 8.4 mm / 1.07 deg). OpenCV's
        # rotation does not depend on the target's scale.
        chosen = "opencv"
        covariance, covariance_model = _covariance(fit, chosen, used)
        transforms = fit.candidates()[chosen]
        scale = replace(scale, fallback=fit.best_opencv)
    if chosen != "opencv" and camera.intrinsics_std:
        problem = scale.problem if scale_applied else fit.problem(chosen)
        k = len(covariance)
        covariance = covariance + _intrinsics_covariance(problem, camera)[:k, :k]
        covariance_model += "+intrinsics"
    rms, per_view = reprojection_rms(setup, used, camera, transforms["x"], transforms["b"],
                                     scale=scale.scale if scale_applied else 1.0)
    label = {"opencv": f"opencv_{fit.best_opencv}"}
    result = HandEyeResult(
        setup=setup, transform=transforms["x"], target_transform=transforms["b"], covariance=covariance[:6, :6],
        target_covariance=covariance[6:12, 6:12],
        method=label.get(chosen, chosen) + ("_scale_corrected" if scale_applied else ""), reprojection_rms_px=rms,
        held_out_rms_px=held.get(chosen, float("nan")),
        held_out_rms_px_by_candidate={label.get(k, k): v for k, v in held.items()},
        per_view_rms_px=per_view, rejected_views=rejected, noise=fit.noise, diversity=diversity,
        opencv={name: xb[0] for name, xb in fit.opencv.items()}, refined_transform=fit.whitened.reference["x"],
        views_used=len(used), scale_check=scale)
    result.extra["full_covariance"] = covariance
    result.extra["covariance_model"] = covariance_model
    result.extra["unknowns"] = list(fit.pixel.names)
    if options.bootstrap > 0 and chosen == "opencv":
        result.bootstrap_covariance = _opencv_bootstrap(fit, used, options, progress)
    elif options.bootstrap > 0:
        result.bootstrap_covariance = _bootstrap(scale.problem if scale_applied else fit.problem(chosen), options,
                                                 progress)
    check_precision(result.covariance, max_translation_std_m=options.max_translation_std_m,
                    max_rotation_std_deg=options.max_rotation_std_deg,
                    what=f"{setup.value} calibration from {len(used)} views", cause=_imprecision_cause(result))
    return result


def _imprecision_cause(result: HandEyeResult) -> str:
    """What to do about an uncertain result, where the calibration knows more than the views."""
    check = result.scale_check
    if check is not None and check.anomalous and not check.applied:
        return (f"the target as described does not fit the views ({check.describe()}). Correct the target's "
                "description (or the intrinsics) and run again, or accept the scale-corrected solution "
                "(--correct-scale); a looser --max-translation-std-m / --max-rotation-std-deg accepts this one.")
    if result.noise.at_bound:
        return (f"the residuals hold more than pixel noise and robot pose error ({result.noise.describe()}): "
                "check the intrinsics (calibrate them from the same views), the target description and the "
                "camera/robot time sync; a looser --max-translation-std-m / --max-rotation-std-deg accepts the "
                "result as it is.")
    return ""


def _bootstrap(problem: _Problem, options: Options,
               progress: Progress = lambda stage, done, total: None) -> np.ndarray:
    """Covariance of X over view resamples (with replacement), the noise model held fixed."""
    rng = np.random.default_rng(options.seed + 1)
    count = len(problem.groups[0].middle)
    deltas = []
    for resample in range(options.bootstrap):
        progress("bootstrap", resample, options.bootstrap)
        resampled = _subset(problem, rng.integers(0, count, count))
        deltas.append(resampled.solve()[6 * resampled.names.index("x"):][:6])
    return np.cov(np.array(deltas).T)


def _opencv_bootstrap(fit: _Fit, views: Sequence[View], options: Options,
                      progress: Progress = lambda stage, done, total: None) -> np.ndarray:
    """_bootstrap of OpenCV's estimate: its method over view resamples."""
    rng = np.random.default_rng(options.seed + 1)
    x = fit.opencv[fit.best_opencv][0]
    deltas = []
    for resample in range(options.bootstrap):
        progress("bootstrap", resample, options.bootstrap)
        estimate = fit.opencv_again([views[i] for i in rng.integers(0, len(views), len(views))])
        if estimate is not None:
            deltas.append(se3.difference(estimate[0], x))
    return np.cov(np.array(deltas).T)


# ----------------------------------------------------------------------------- eye-to-hand, fixed target

def average_fixed_view(detections: Sequence[Detection], camera: CameraModel) -> tuple[Detection, float]:
    """One view of a fixed camera seeing a fixed target from many frames, and its pixel noise.

    A fixed camera sees the same image in every frame: what differs from frame to frame is
    sensor noise, while the corners' detection errors that come from the image itself (the
    print, the lens, the renderer) are the same in every frame and do not average out.
    Measured on the emulated cell (12 frames of the board at 0.9 m): corners scatter
    0.03 px between frames but sit 0.09 px RMS off the board's best fit, the same in every
    frame; counting the frames as independent views made the static camera's covariance
    5x too optimistic (Mahalanobis^2 20-35 for 3 dof). So the frames are averaged into one
    view (each corner seen in at least half of them), and its noise is its own: the
    residual of that view's pose fit, sqrt(RSS / (2N - 6)).
    """
    frames = [d for d in detections if len(d)]
    seen: dict[int, list[np.ndarray]] = {}
    points: dict[int, np.ndarray] = {}
    for d in frames:
        for corner, obj, pixel in zip(d.ids, d.object_points, d.image_points):
            seen.setdefault(int(corner), []).append(pixel)
            points[int(corner)] = obj
    kept = sorted(c for c, pixels in seen.items() if 2 * len(pixels) >= len(frames))
    if len(kept) < MIN_FIXED_VIEW_POINTS:
        raise DegenerateData(f"the static camera saw {len(kept)} target points in at least half of its "
                             f"{len(frames)} images; {MIN_FIXED_VIEW_POINTS} are needed: move the target "
                             "(or the robot, if it hides it) fully into the camera's view")
    view = Detection(np.array(kept), np.array([points[c] for c in kept]),
                     np.array([np.mean(seen[c], axis=0) for c in kept]))
    camera_T_target = solve_pnp(view, camera)
    predicted = camera.project(view.object_points @ camera_T_target[:3, :3].T + camera_T_target[:3, 3])
    residual = predicted - view.image_points
    return view, float(np.sqrt(np.sum(residual ** 2) / (2 * len(kept) - 6)))


# An averaged fixed view's noise comes from its own pose fit (2N - 6 degrees of freedom):
# 8 points give it 10, a noise level known to about +-25 %.
MIN_FIXED_VIEW_POINTS = 8


def calibrate_static_camera_via_fixed_target(wrist_views: Sequence[View], wrist_camera: CameraModel,
                                             static_detections: Sequence[Detection], static_camera: CameraModel,
                                             options: Options = Options()) -> tuple[HandEyeResult, HandEyeResult]:
    """base_T_static_camera from a target fixed in the cell, seen by a wrist camera and the static one.

    The wrist camera's eye-in-hand calibration determines base_T_target; the static camera's
    views of the same target then give base_T_camera = base_T_target . target_T_camera. Both
    are solved jointly, so the static camera's covariance includes the uncertainty of
    base_T_target. The static camera's images are one view to the solve (average_fixed_view:
    its frames share their detection errors) with its own pixel noise; the static result's
    `noise` is that view's. Returns (static camera result, wrist camera result).
    """
    if len(static_detections) < 1:
        raise DegenerateData("the static camera saw the target in no image; move the robot out of its "
                             "view or check that the target is inside its field of view")
    view, pixel_std = average_fixed_view(static_detections, static_camera)
    wrist = calibrate(Setup.EYE_IN_HAND, wrist_views, wrist_camera, replace(options, bootstrap=0))
    used = [v for i, v in enumerate(wrist_views) if i not in set(wrist.rejected_views)]
    static_group = _Group(static_camera, "y", "b", [np.eye(4)], [view], None, pixel_std=pixel_std)
    y0 = wrist.target_transform @ se3.inv(solve_pnp(view, static_camera))
    fit = _fit(Setup.EYE_IN_HAND, used, wrist_camera, options, [static_group], {"y": y0})
    chosen = "refined_robot_noise" if wrist.method == "refined_robot_noise" else "refined"
    problem = fit.problem(chosen)
    transforms = problem.reference
    full, covariance_model = _covariance(fit, chosen)
    # Reorder the unknowns: the static camera's transform, then the target's, then the wrist camera's.
    iy, ib, ix = (problem.names.index(n) for n in ("y", "b", "x"))
    order = np.concatenate([np.arange(6 * i, 6 * i + 6) for i in (iy, ib, ix)])
    covariance = full[np.ix_(order, order)]
    static_rms = float(np.sqrt(np.mean(problem.view_residual(transforms, 1, 0) ** 2) * 2))
    static = HandEyeResult(
        setup=Setup.EYE_TO_HAND, transform=transforms["y"], target_transform=transforms["b"],
        covariance=covariance[:6, :6], target_covariance=covariance[6:12, 6:12], method=f"{chosen}_fixed_target",
        reprojection_rms_px=static_rms, held_out_rms_px=wrist.held_out_rms_px,
        held_out_rms_px_by_candidate=dict(wrist.held_out_rms_px_by_candidate),
        per_view_rms_px=[static_rms], rejected_views=[], noise=NoiseModel(pixel_std, 0.0, 0.0),
        diversity=wrist.diversity, refined_transform=transforms["y"], views_used=len(static_detections))
    static.extra["wrist_gripper_T_camera"] = transforms["x"]
    static.extra["covariance_model"] = covariance_model + "_averaged_fixed_view"
    check_precision(static.covariance, max_translation_std_m=options.max_translation_std_m,
                    max_rotation_std_deg=options.max_rotation_std_deg,
                    what=f"static camera through the fixed target ({len(static_detections)} views)")
    return static, wrist


def pair_views(base_T_gripper: Sequence[np.ndarray], detections: Sequence[Detection | None],
               labels: Sequence[str] | None = None) -> tuple[list[View], list[str]]:
    """Views from parallel lists of robot poses and detections (None: target not found).

    Returns (views, labels of the images where the target was not found)."""
    if len(base_T_gripper) != len(detections):
        raise InconsistentInput(
            f"{len(base_T_gripper)} robot poses but {len(detections)} images: every image needs the robot "
            "pose at its time; check that the pose and image lists come from the same capture")
    labels = list(labels) if labels is not None else [str(i) for i in range(len(detections))]
    views, missing = [], []
    for pose, detection, label in zip(base_T_gripper, detections, labels):
        if detection is None:
            missing.append(label)
            continue
        if pose.shape != (4, 4) or not np.all(np.isfinite(pose)):
            raise InconsistentInput(f"robot pose of view {label} is not a finite 4x4 transform")
        views.append(View(np.asarray(pose, dtype=float), detection, label=label))
    return views, missing
