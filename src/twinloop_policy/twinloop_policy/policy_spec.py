"""The policy folder: `policy.yaml` (what the policy needs and gives) beside its TorchScript module.

Pure Python (no rclpy). The runner refuses a policy whose spec does not match the robot
(joint names, observation sizes, rate) or whose module does not match its own spec,
listing every mismatch at once so one edit fixes them all.

policy.yaml (format twinloop-policy/1):
    format: twinloop-policy/1
    name: reach_pd                   # folder-safe
    version: "1"                     # recorded with every trial as policy_version name@version
    module: policy.pt                # TorchScript file in the folder (torch.jit.save)
    rate_hz: 250.0                   # inference and command rate
    action:
      type: joint_position           # absolute position targets, one per joint
      joints: [panda_joint1, ...]
    observation:                     # concatenated in this order into one float64 vector
      - {name: q, kind: joint_position, joints: [...], size: 7, max_age_s: 0.02}
      - {name: dq, kind: joint_velocity, joints: [...], size: 7, max_age_s: 0.02}
    trial:
      timeout_s: 8.0                 # a trial that has not succeeded by then fails
      goal_joint_positions: {panda_joint1: 0.3, ...}   # success: all within tolerance
      goal_tolerance_rad: 0.01
    twin_version: emulated/v0        # what it was trained in (provenance)
    randomization: {}                # what it was trained with (provenance)
    training: {curve: []}
The module takes the observation vector (float64, shape [size]) and returns the action
(float64, shape [len(action.joints)]); an optional exported `reset()` is called at the
start of every trial (stateful and recurrent policies).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

FORMAT = "twinloop-policy/1"
SPEC_FILE = "policy.yaml"
OBSERVATION_KINDS = ("joint_position", "joint_velocity")
ACTION_TYPES = ("joint_position",)
# the keys of each section: anything else is a typo or a newer format, refused by name
KEYS = {"<top>": {"format", "name", "version", "module", "rate_hz", "action", "observation", "trial", "twin_version",
                  "randomization", "training"},
        "action": {"type", "joints"}, "observation[]": {"name", "kind", "joints", "size", "max_age_s"},
        "trial": {"timeout_s", "goal_joint_positions", "goal_tolerance_rad"}}
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class PolicySpecError(ValueError):
    """policy.yaml is malformed; the message names the file, the key and the fix."""


class PolicyMismatch(ValueError):
    """The policy does not fit this robot (or its module does not fit its spec)."""

    def __init__(self, problems: list[str], where: str) -> None:
        super().__init__(f"policy {where} does not match: " + "; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ObservationTerm:
    name: str
    kind: str
    joints: tuple[str, ...]
    size: int
    max_age_s: float


@dataclass(frozen=True)
class PolicySpec:
    folder: Path
    name: str
    version: str
    module: str
    rate_hz: float
    action_joints: tuple[str, ...]
    observation: tuple[ObservationTerm, ...]
    trial_timeout_s: float
    goal_joint_positions: dict[str, float]
    goal_tolerance_rad: float
    twin_version: str = ""
    randomization: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)

    @property
    def observation_size(self) -> int:
        return sum(term.size for term in self.observation)

    @property
    def policy_version(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def module_path(self) -> Path:
        return self.folder / self.module

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "version": self.version, "module": self.module,
                "rate_hz": self.rate_hz, "action": {"type": "joint_position", "joints": list(self.action_joints)},
                "observation": [{"name": t.name, "kind": t.kind, "joints": list(t.joints), "size": t.size,
                                 "max_age_s": t.max_age_s} for t in self.observation],
                "trial": {"timeout_s": self.trial_timeout_s, "goal_joint_positions": dict(self.goal_joint_positions),
                          "goal_tolerance_rad": self.goal_tolerance_rad},
                "twin_version": self.twin_version, "randomization": dict(self.randomization),
                "training": dict(self.training)}


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> PolicySpecError:
        return PolicySpecError(f"{self.path}: '{key}' {problem}")

    def get(self, raw: Mapping, key: str, full: str, kind, *, positive: bool = False):
        if key not in raw:
            raise self.fail(full, "is missing; see the layout in twinloop_policy/policy_spec.py")
        value = raw[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise self.fail(full, f"must be a {kind.__name__}, got {value!r}")
        if kind is float and (not math.isfinite(value) or positive and value <= 0):
            raise self.fail(full, f"must be a finite{' positive' if positive else ''} number, got {value!r}")
        return value

    def known(self, raw: Mapping, section: str, where: str | None = None) -> None:
        unknown = sorted(str(k) for k in raw if k not in KEYS[section])
        if unknown and section == "<top>":
            raise PolicySpecError(f"{self.path}: unknown keys {unknown}; known: {sorted(KEYS[section])}")
        if unknown:
            raise self.fail(where or section, f"has unknown keys {unknown}; known: {sorted(KEYS[section])}")

    def mapping(self, raw: Mapping, key: str) -> dict:
        value = raw.get(key) or {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {value!r}")
        return dict(value)

    def names(self, raw: Mapping, key: str, full: str) -> tuple[str, ...]:
        value = self.get(raw, key, full, list)
        if not value or not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
            raise self.fail(full, f"must be a non-empty list of distinct joint names, got {value!r}")
        return tuple(value)


def load_policy_spec(folder: Path | str) -> PolicySpec:
    folder = Path(folder)
    path = folder / SPEC_FILE
    if not path.is_file():
        raise PolicySpecError(f"{path} does not exist: a policy folder holds {SPEC_FILE} and its module "
                              "(build one with `twinloop policy scripted` or the training export)")
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as error:
        why = " ".join(str(error).split())
        raise PolicySpecError(f"{path}: cannot be read as YAML ({why})") from error
    r = _Reader(path)
    if not isinstance(raw, dict):
        raise r.fail("<top>", "must be a mapping")
    r.known(raw, "<top>")
    if raw.get("format") != FORMAT:
        raise r.fail("format", f"is {raw.get('format')!r}; this runner reads {FORMAT!r}")
    name = r.get(raw, "name", "name", str)
    if not _SAFE.fullmatch(name):
        raise r.fail("name", f"{name!r} must be folder-safe (letters, digits, '.', '_', '-')")
    action = r.get(raw, "action", "action", dict)
    r.known(action, "action")
    if action.get("type") not in ACTION_TYPES:
        raise r.fail("action.type", f"is {action.get('type')!r}; supported: {list(ACTION_TYPES)}")
    terms = []
    for i, term in enumerate(r.get(raw, "observation", "observation", list)):
        where = f"observation[{i}]"
        if not isinstance(term, dict):
            raise r.fail(where, "must be a mapping")
        r.known(term, "observation[]", where)
        size = r.get(term, "size", f"{where}.size", int)
        if size <= 0:
            raise r.fail(f"{where}.size", f"must be > 0, got {size}")
        kind = r.get(term, "kind", f"{where}.kind", str)
        if kind not in OBSERVATION_KINDS:
            raise r.fail(f"{where}.kind", f"is {kind!r}; supported: {list(OBSERVATION_KINDS)}")
        terms.append(ObservationTerm(name=r.get(term, "name", f"{where}.name", str), kind=kind,
                                     joints=r.names(term, "joints", f"{where}.joints"),
                                     size=size,
                                     max_age_s=r.get(term, "max_age_s", f"{where}.max_age_s", float, positive=True)))
    if not terms:
        raise r.fail("observation", "lists no term")
    trial = r.get(raw, "trial", "trial", dict)
    r.known(trial, "trial")
    goal = r.get(trial, "goal_joint_positions", "trial.goal_joint_positions", dict)
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for k, v in goal.items()):
        raise r.fail("trial.goal_joint_positions", "must map joint names to finite numbers")
    module = r.get(raw, "module", "module", str)
    if "/" in module or module in ("", ".", ".."):
        raise r.fail("module", f"{module!r} must be a file name in the policy folder")
    if not (folder / module).is_file():
        raise r.fail("module", f"names {module!r}, which is not in {folder}")
    return PolicySpec(folder=folder, name=name, version=str(r.get(raw, "version", "version", str)), module=module,
                      rate_hz=r.get(raw, "rate_hz", "rate_hz", float, positive=True),
                      action_joints=r.names(action, "joints", "action.joints"), observation=tuple(terms),
                      trial_timeout_s=r.get(trial, "timeout_s", "trial.timeout_s", float, positive=True),
                      goal_joint_positions={k: float(v) for k, v in goal.items()},
                      goal_tolerance_rad=r.get(trial, "goal_tolerance_rad", "trial.goal_tolerance_rad", float,
                                               positive=True),
                      twin_version=str(raw.get("twin_version") or ""), randomization=r.mapping(raw, "randomization"),
                      training=r.mapping(raw, "training"))


def write_policy_spec(spec: PolicySpec) -> Path:
    path = spec.folder / SPEC_FILE
    path.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    return path


def check_against_robot(spec: PolicySpec, *, commandable: Sequence[str], measured: Sequence[str],
                        joint_state_rate_hz: float) -> None:
    """Raise PolicyMismatch listing every way the spec does not fit this robot."""
    problems = []
    unknown = [j for j in spec.action_joints if j not in commandable]
    if unknown:
        problems.append(f"action joints {unknown} are not commandable joints of this robot {list(commandable)} "
                        "(check the joint-name mapping of the export)")
    for term in spec.observation:
        missing = [j for j in term.joints if j not in measured]
        if missing:
            problems.append(f"observation '{term.name}' reads joints {missing} that /joint_states does not report")
        if term.size != len(term.joints):
            problems.append(f"observation '{term.name}' declares size {term.size} but lists {len(term.joints)} joints")
        if term.max_age_s < 1.0 / joint_state_rate_hz:
            problems.append(f"observation '{term.name}' wants data younger than {term.max_age_s * 1e3:.1f} ms, "
                            f"but joint states come every {1e3 / joint_state_rate_hz:.1f} ms")
    if spec.rate_hz > joint_state_rate_hz:
        problems.append(f"rate {spec.rate_hz:.0f} Hz is faster than the robot's joint states "
                        f"({joint_state_rate_hz:.0f} Hz): observations would repeat")
    goal_unknown = [j for j in spec.goal_joint_positions if j not in measured]
    if goal_unknown:
        problems.append(f"trial goal names joints {goal_unknown} that /joint_states does not report")
    if problems:
        raise PolicyMismatch(problems, str(spec.folder))
