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
      - {name: box, kind: box_position, topic: /twinloop/perception/box_pose, size: 2, max_age_s: 1.0}
                                     # box_position: x, y (m, world) of the box tracker's pose
    trial:
      timeout_s: 8.0                 # a trial that has not succeeded by then fails
      goal_joint_positions: {panda_joint1: 0.3, ...}   # success: all within tolerance
      goal_tolerance_rad: 0.01
      goal_box_xy: [0.45, -0.05]     # optional: success is judged at timeout_s, on the box:
      goal_radius_m: 0.015           #   within goal_radius_m of goal_box_xy (the tracker's pose)
    twin_version: emulated/v0        # what it was trained in (provenance)
    randomization: {}                # what it was trained with (provenance)
    training: {curve: []}
The module takes the observation vector (float64, shape [size]) and returns the action
(float64, shape [len(action.joints)]); an optional exported `reset()` is called at the
start of every trial (stateful and recurrent policies).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

FORMAT = "twinloop-policy/1"
SPEC_FILE = "policy.yaml"
OBSERVATION_KINDS = ("joint_position", "joint_velocity", "box_position")
ACTION_TYPES = ("joint_position",)
# the keys of each section: anything else is a typo or a newer format, refused by name
KEYS = {"<top>": {"format", "name", "version", "module", "rate_hz", "action", "observation", "trial", "twin_version",
                  "randomization", "training"},
        "action": {"type", "joints"}, "observation[]": {"name", "kind", "joints", "topic", "size", "max_age_s"},
        "trial": {"timeout_s", "goal_joint_positions", "goal_tolerance_rad", "goal_box_xy", "goal_radius_m"}}
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
    joints: tuple[str, ...]  # joint kinds; empty for box_position
    size: int
    max_age_s: float
    topic: str = ""  # box_position: the pose topic (geometry_msgs/PoseWithCovarianceStamped)


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
    goal_box_xy: tuple[float, float] | None = None  # success judged on the box at the trial's end
    goal_radius_m: float = 0.0

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
                "observation": [_term_dict(t) for t in self.observation],
                "trial": {"timeout_s": self.trial_timeout_s, "goal_joint_positions": dict(self.goal_joint_positions),
                          "goal_tolerance_rad": self.goal_tolerance_rad,
                          **({"goal_box_xy": list(self.goal_box_xy), "goal_radius_m": self.goal_radius_m}
                             if self.goal_box_xy is not None else {})},
                "twin_version": self.twin_version, "randomization": dict(self.randomization),
                "training": dict(self.training)}


def _term_dict(term: ObservationTerm) -> dict[str, Any]:
    if term.kind == "box_position":
        return {"name": term.name, "kind": term.kind, "topic": term.topic, "size": term.size,
                "max_age_s": term.max_age_s}
    return {"name": term.name, "kind": term.kind, "joints": list(term.joints), "size": term.size,
            "max_age_s": term.max_age_s}


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
        if kind == "box_position":
            topic = r.get(term, "topic", f"{where}.topic", str)
            if not topic.startswith("/"):
                raise r.fail(f"{where}.topic", f"must be an absolute topic name, got {topic!r}")
            joints: tuple[str, ...] = ()
        else:
            topic, joints = "", r.names(term, "joints", f"{where}.joints")
        terms.append(ObservationTerm(name=r.get(term, "name", f"{where}.name", str), kind=kind, joints=joints,
                                     size=size,
                                     max_age_s=r.get(term, "max_age_s", f"{where}.max_age_s", float, positive=True),
                                     topic=topic))
    if not terms:
        raise r.fail("observation", "lists no term")
    trial = r.get(raw, "trial", "trial", dict)
    r.known(trial, "trial")
    goal = r.get(trial, "goal_joint_positions", "trial.goal_joint_positions", dict)
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for k, v in goal.items()):
        raise r.fail("trial.goal_joint_positions", "must map joint names to finite numbers")
    goal_box = trial.get("goal_box_xy")
    if goal_box is not None and not (isinstance(goal_box, list) and len(goal_box) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in goal_box)):
        raise r.fail("trial.goal_box_xy", f"must be [x, y] in metres, got {goal_box!r}")
    radius = r.get(trial, "goal_radius_m", "trial.goal_radius_m", float, positive=True) if goal_box is not None else 0.0
    if goal_box is not None and not any(t.kind == "box_position" for t in terms):
        raise r.fail("trial.goal_box_xy", "needs a box_position observation term to judge the box by")
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
                      training=r.mapping(raw, "training"),
                      goal_box_xy=tuple(float(v) for v in goal_box) if goal_box is not None else None,
                      goal_radius_m=radius)


def write_policy_spec(spec: PolicySpec) -> Path:
    path = spec.folder / SPEC_FILE
    path.write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    return path


def write_policy_folder(folder: Path | str, spec: PolicySpec, save_module: Callable[[Path], None]) -> PolicySpec:
    """Write a new policy folder: `save_module(path)` writes the module file, then
    policy.yaml (`spec`, its folder replaced). The folder is built beside its final place
    and renamed into it only once policy.yaml reads back, so a failure leaves nothing.

    Raises FileExistsError when `folder` exists (unless it is an empty folder): a policy
    folder is never overwritten."""
    folder = check_new_folder(folder)
    created = _make_parents(folder.parent)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            save_module(staging / spec.module)
            write_policy_spec(dataclasses.replace(spec, folder=staging))
            load_policy_spec(staging)  # what the runner will read must read back
            staging.chmod(0o755)  # mkdtemp makes it private
            os.rename(staging, folder)  # onto nothing or an empty folder; never over a policy
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except BaseException:
        for parent in created:  # only folders this call made, and only while empty
            try:
                parent.rmdir()
            except OSError:
                break
        raise
    return dataclasses.replace(spec, folder=folder)


def check_new_folder(folder: Path | str) -> Path:
    """`folder` as a Path; FileExistsError unless it is free for a new policy folder
    (missing, or an empty folder)."""
    folder = Path(folder)
    if folder.is_symlink() or folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        what = "a folder that is not empty" if folder.is_dir() else "a file"
        raise FileExistsError(f"{folder} exists already ({what}); a policy folder is never overwritten: "
                              "give a new folder")
    return folder


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns those created, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, so no policy folder can be made under it")
    for path in reversed(missing):
        path.mkdir()
    return missing


def check_against_robot(spec: PolicySpec, *, commandable: Sequence[str], measured: Sequence[str],
                        joint_state_rate_hz: float) -> None:
    """Raise PolicyMismatch listing every way the spec does not fit this robot."""
    problems = []
    unknown = [j for j in spec.action_joints if j not in commandable]
    if unknown:
        problems.append(f"action joints {unknown} are not commandable joints of this robot {list(commandable)} "
                        "(check the joint-name mapping of the export)")
    for term in spec.observation:
        if term.kind == "box_position":
            if term.size != 2:
                problems.append(f"observation '{term.name}' is a box position (x, y) but declares size {term.size}")
            continue
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
