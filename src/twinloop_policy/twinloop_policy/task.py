"""The box carry task: typed configuration, reward terms, success test.

Pure Python (numpy, yaml; no MuJoCo, no rclpy). The layout and the reasons for each value
are in config/policy_task.yaml. Reward terms are small functions of the episode's end
state, summed by `reward`; `success` is the task's one success test, used by training,
evaluation and the scoring of real trials alike.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

class TaskConfigError(ValueError):
    """config/policy_task.yaml is malformed; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class CarryConfig:
    approach_s: float
    settle_s: float
    above_m: float
    descend_s: float
    close_s: float
    lift_m: float
    lift_s: float
    place_s: float
    release_s: float
    retreat_s: float
    squeeze_range_m: tuple[float, float]
    carry_s_range: tuple[float, float]


@dataclass(frozen=True)
class GoalConfig:
    direction_deg: float
    distance_m: float
    radius_m: float
    distance_variation_m: float

    @property
    def direction(self) -> np.ndarray:
        """Unit vector from the box's nominal place towards the goal, world xy."""
        angle = math.radians(self.direction_deg)
        return np.array([math.cos(angle), math.sin(angle)])


@dataclass(frozen=True)
class EpisodeConfig:
    rest_s: float
    rest_speed_m_s: float
    max_grip_force_n: float
    policy_rate_hz: float


@dataclass(frozen=True)
class BoxStartConfig:
    position_std_m: float


@dataclass(frozen=True)
class ObservationConfig:
    box_position_std_m: float
    box_latency_s: float


@dataclass(frozen=True)
class RewardConfig:
    success_bonus: float
    distance_weight: float
    grip_force_weight: float
    carry_time_weight: float
    tilt_weight: float


@dataclass(frozen=True)
class VariationConfig:
    wide: dict[str, tuple[float, float]]
    prior_range_sigma: float
    prior_floor_fraction: float


@dataclass(frozen=True)
class TrainingConfig:
    contexts: int
    physics_per_candidate: int
    cem_population: int
    cem_iterations: int
    cem_elite: int
    student_hidden: int
    student_epochs: int
    evaluation_episodes: int
    workers: int
    seed: int


@dataclass(frozen=True)
class TaskConfig:
    carry: CarryConfig
    goal: GoalConfig
    episode: EpisodeConfig
    box_start: BoxStartConfig
    observation: ObservationConfig
    reward: RewardConfig
    variation: VariationConfig
    training: TrainingConfig
    source: str = "<dict>"


WIDE_KEYS = ("box.mass_kg", "box.friction", "finger.friction", "command.delay_s", "joint_gain_factor")
_SECTIONS = {"carry": CarryConfig, "goal": GoalConfig, "episode": EpisodeConfig, "box_start": BoxStartConfig,
             "observation": ObservationConfig, "reward": RewardConfig, "variation": VariationConfig,
             "training": TrainingConfig}
# may be zero; every other number must be > 0
_NON_NEGATIVE = {"goal.distance_variation_m", "goal.direction_deg", "reward.grip_force_weight",
                 "reward.carry_time_weight", "box_start.position_std_m", "observation.box_position_std_m",
                 "observation.box_latency_s", "reward.tilt_weight", "training.seed", "variation.prior_floor_fraction"}


def default_task_path() -> Path:
    from twinloop_twin.workcell import default_config_dir
    return default_config_dir() / "policy_task.yaml"


def load_task_config(path: Path | str | None = None) -> TaskConfig:
    path = Path(path) if path is not None else default_task_path()
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        why = " ".join(str(error).split())
        raise TaskConfigError(f"{path}: cannot be read as YAML ({why}); check the path and the syntax") from error
    return task_config_from_dict(raw, source=str(path))


def task_config_from_dict(raw: Any, *, source: str = "<dict>") -> TaskConfig:
    def fail(key: str, problem: str) -> TaskConfigError:
        return TaskConfigError(f"{source}: '{key}' {problem}; see config/policy_task.yaml for the layout")

    def number(value: Any, key: str, kind: type) -> Any:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or kind is int and not isinstance(value, int):
            raise fail(key, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        if not math.isfinite(value):
            raise fail(key, f"must be finite, got {value}")
        if value < 0 or value == 0 and key not in _NON_NEGATIVE:
            raise fail(key, f"must be {'>= 0' if key in _NON_NEGATIVE else '> 0'}, got {value}")
        return kind(value)

    def pair(value: Any, key: str) -> tuple[float, float]:
        if not isinstance(value, list) or len(value) != 2:
            raise fail(key, f"must be a [low, high] pair, got {value!r}")
        low, high = (number(v, key, float) for v in value)
        if low >= high:
            raise fail(key, f"must have low < high, got {value}")
        return low, high

    if not isinstance(raw, Mapping):
        raise fail("<top level>", "must be a mapping")
    unknown = sorted(set(map(str, raw)) - set(_SECTIONS))
    if unknown:
        raise fail(unknown[0], f"is not a section (sections: {list(_SECTIONS)})")
    sections = {}
    for name, kind in _SECTIONS.items():
        section = raw.get(name)
        if not isinstance(section, Mapping):
            raise fail(name, "is missing or not a mapping")
        known = {f.name: f.type for f in fields(kind)}
        for key in section:
            if key not in known:
                raise fail(f"{name}.{key}", f"is not a key of {name} (keys: {list(known)})")
        values = {}
        for key, annotation in known.items():
            full = f"{name}.{key}"
            if key not in section:
                raise fail(full, "is missing")
            value = section[key]
            if key == "wide":
                if not isinstance(value, Mapping) or set(value) != set(WIDE_KEYS):
                    raise fail(full, f"must map exactly {list(WIDE_KEYS)} to [low, high] ranges")
                values[key] = {k: pair(value[k], f"{full}.{k}") for k in WIDE_KEYS}
            elif "tuple" in str(annotation):
                values[key] = pair(value, full)
            else:
                values[key] = number(value, full, int if annotation in (int, "int") else float)
        sections[name] = kind(**values)
    config = TaskConfig(**sections, source=source)
    if config.training.cem_elite > config.training.cem_population:
        raise fail("training.cem_elite", f"({config.training.cem_elite}) must not exceed training.cem_population "
                                         f"({config.training.cem_population})")
    if config.goal.distance_variation_m >= config.goal.distance_m:
        raise fail("goal.distance_variation_m", "must be smaller than goal.distance_m")
    if config.carry.squeeze_range_m[1] >= 0.04:
        raise fail("carry.squeeze_range_m", "must stay below 0.04 m, the envelope monitor's gripper max_target_lead")
    return config


# ---- reward terms and the success test (on an episode's end state) ----

@dataclass(frozen=True)
class EpisodeEnd:
    """How an episode ended: where the box rests, how fast it still moves, how tilted; the
    peak grip force and the carry's duration the policy chose."""

    box_xy: np.ndarray  # m, world
    box_speed_m_s: float
    box_tilt_rad: float  # angle between the box's z axis and the world's
    goal_xy: np.ndarray
    grip_force_n: float  # peak |gripper actuator force| while closed
    carry_s: float


def goal_distance(end: EpisodeEnd) -> float:
    return float(np.linalg.norm(np.asarray(end.box_xy) - np.asarray(end.goal_xy)))


def success(end: EpisodeEnd, task: TaskConfig) -> bool:
    """The box rests upright within the goal radius and was never squeezed harder than allowed."""
    return (goal_distance(end) <= task.goal.radius_m and end.box_speed_m_s < task.episode.rest_speed_m_s
            and end.box_tilt_rad < math.radians(20.0) and end.grip_force_n <= task.episode.max_grip_force_n)


def success_term(end: EpisodeEnd, task: TaskConfig) -> float:
    return task.reward.success_bonus if success(end, task) else 0.0


def distance_term(end: EpisodeEnd, task: TaskConfig) -> float:
    return -task.reward.distance_weight * goal_distance(end)


def grip_force_term(end: EpisodeEnd, task: TaskConfig) -> float:
    return -task.reward.grip_force_weight * end.grip_force_n


def carry_time_term(end: EpisodeEnd, task: TaskConfig) -> float:
    return -task.reward.carry_time_weight * end.carry_s


def tilt_term(end: EpisodeEnd, task: TaskConfig) -> float:
    return -task.reward.tilt_weight * end.box_tilt_rad


REWARD_TERMS = (success_term, distance_term, grip_force_term, carry_time_term, tilt_term)


def reward(end: EpisodeEnd, task: TaskConfig) -> float:
    return float(sum(term(end, task) for term in REWARD_TERMS))


def box_tilt_rad(quat_wxyz: np.ndarray) -> float:
    """Angle between the box's z axis and the world's z axis."""
    w, x, y, z = (float(v) for v in quat_wxyz)
    norm = w * w + x * x + y * y + z * z
    cos_tilt = 1.0 - 2.0 * (x * x + y * y) / norm  # R[2, 2]
    return math.acos(max(-1.0, min(1.0, cos_tilt)))
