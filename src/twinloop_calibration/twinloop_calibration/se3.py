"""Rigid transforms as 4x4 numpy arrays: the few operations the calibration needs.

Rotations go through scipy's Rotation (exp/log maps); nothing here is a home-made
quaternion library.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def make(rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = rotation
    out[:3, 3] = np.asarray(translation, dtype=float).ravel()
    return out


def from_rotvec(rotvec: np.ndarray, translation: np.ndarray) -> np.ndarray:
    return make(Rotation.from_rotvec(np.asarray(rotvec, dtype=float).ravel()).as_matrix(), translation)


def from_xyz_quat(xyz, quat_xyzw) -> np.ndarray:
    return make(Rotation.from_quat(np.asarray(quat_xyzw, dtype=float)).as_matrix(), xyz)


def to_xyz_quat(transform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(translation, quaternion x y z w) of a transform."""
    return transform[:3, 3].copy(), Rotation.from_matrix(transform[:3, :3]).as_quat()


def inv(transform: np.ndarray) -> np.ndarray:
    rotation = transform[:3, :3]
    return make(rotation.T, -rotation.T @ transform[:3, 3])


def rotvec(rotation: np.ndarray) -> np.ndarray:
    return Rotation.from_matrix(rotation).as_rotvec()


def perturb(transform: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """[exp(dr) R, t + dt] for delta = (dt, dr): the local parametrisation the solver and the
    reported covariance use (translation and rotation error both in the parent frame)."""
    delta = np.asarray(delta, dtype=float)
    return make(Rotation.from_rotvec(delta[3:]).as_matrix() @ transform[:3, :3], transform[:3, 3] + delta[:3])


def difference(estimate: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(dt, dr) with estimate = perturb(truth, (dt, dr)), the inverse of `perturb`."""
    return np.concatenate([estimate[:3, 3] - truth[:3, 3], rotvec(estimate[:3, :3] @ truth[:3, :3].T)])


def twist(transform: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """transform . exp(delta) with delta = (dt, dr) in the transform's own (child) frame."""
    return transform @ from_rotvec(np.asarray(delta)[3:], np.asarray(delta)[:3])


def errors(estimate: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(translation error in m, rotation error in rad)."""
    d = difference(estimate, truth)
    return float(np.linalg.norm(d[:3])), float(np.linalg.norm(d[3:]))


def mean(transforms: list[np.ndarray]) -> np.ndarray:
    """Chordal mean of rotations (scipy) and arithmetic mean of translations."""
    rotation = Rotation.from_matrix(np.array([t[:3, :3] for t in transforms])).mean().as_matrix()
    return make(rotation, np.mean([t[:3, 3] for t in transforms], axis=0))
