"""The physics schema: every config file loads, and every kind of bad file is rejected by name."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from twinloop_twin.physics import (
    ALL_JOINTS,
    ARM_JOINTS,
    FINGER_JOINTS,
    PhysicsConfigError,
    WorkcellPhysics,
    load_physics,
    physics_from_dict,
    physics_to_dict,
)
from twinloop_twin.workcell import default_config_dir

PHYSICS_FILES = ("nominal_physics.yaml", "emulated_truth.yaml", "emulated_truth_slow.yaml")


def _config(name: str) -> Path:
    return default_config_dir() / name


def _raw(name: str = "nominal_physics.yaml") -> dict:
    return yaml.safe_load(_config(name).read_text())


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), tree


def test_joint_name_constants():
    assert len(ARM_JOINTS) == 7 and len(FINGER_JOINTS) == 2
    assert ALL_JOINTS == ARM_JOINTS + FINGER_JOINTS


@pytest.mark.parametrize("name", PHYSICS_FILES)
def test_every_physics_file_loads_and_round_trips(name):
    physics = load_physics(_config(name))
    assert isinstance(physics, WorkcellPhysics)
    assert set(physics.joints) == set(ALL_JOINTS)
    assert physics.joints["panda_finger_joint2"].kp is None  # the mimic joint has no actuator
    assert physics_from_dict(physics_to_dict(physics), source=physics.source) == physics
    assert math.isclose(physics.command_delay_s * 1000.0, _raw(name)["command_delay_ms"])


def test_all_physics_files_have_the_same_keys():
    key_sets = [{key for key, _ in _leaves(_raw(name))} for name in PHYSICS_FILES]
    assert key_sets[0] == key_sets[1] == key_sets[2]


def test_truth_differs_from_nominal_in_every_parameter():
    nominal, truth = dict(_leaves(_raw("nominal_physics.yaml"))), dict(_leaves(_raw("emulated_truth.yaml")))
    same = [key for key, value in nominal.items() if value is not None and value == truth[key]]
    assert same == [], f"emulated truth equals nominal in {same}"


def test_slow_truth_is_visibly_slower_than_truth():
    truth = load_physics(_config("emulated_truth.yaml"))
    slow = load_physics(_config("emulated_truth_slow.yaml"))
    assert slow.command_delay_s >= 4 * truth.command_delay_s
    for joint in ARM_JOINTS:
        assert slow.joints[joint].kp < truth.joints[joint].kp


def _broken(edit) -> dict:
    raw = copy.deepcopy(_raw())
    edit(raw)
    return raw


@pytest.mark.parametrize("edit, key, problem", [
    (lambda raw: raw["joints"]["panda_joint3"].pop("damping"), "joints.panda_joint3.damping", "missing"),
    (lambda raw: raw.pop("command_delay_ms"), "command_delay_ms", "missing"),
    (lambda raw: raw["joints"]["panda_joint2"].update(damping=-1.0), "joints.panda_joint2.damping", ">= 0"),
    (lambda raw: raw["box"].update(mass_kg=float("nan")), "box.mass_kg", "finite"),
    (lambda raw: raw["joints"].update(panda_joint8=raw["joints"]["panda_joint1"]), "joints.panda_joint8",
     "unknown joint"),
    (lambda raw: raw.update(gravity=9.81), "gravity", "unknown key"),
    (lambda raw: raw["noise"].update(depth_std_m="small"), "noise.depth_std_m", "must be a number"),
    (lambda raw: raw["noise"].update(depth_std_m="5e-05"), "noise.depth_std_m", "5.0e-05"),
    (lambda raw: raw["joints"]["panda_joint1"].update(kp=True), "joints.panda_joint1.kp", "must be a number"),
    (lambda raw: raw["joints"]["panda_joint1"].update(kp=0.0), "joints.panda_joint1.kp", "> 0"),
    (lambda raw: raw["joints"]["panda_finger_joint2"].update(kp=10.0), "joints.panda_finger_joint2.kp", "null"),
    (lambda raw: raw.update(box=[0.5, 0.4]), "box", "mapping"),
])
def test_bad_physics_raises_naming_the_key(edit, key, problem):
    with pytest.raises(PhysicsConfigError) as error:
        physics_from_dict(_broken(edit), source="broken.yaml")
    message = str(error.value)
    assert "broken.yaml" in message and f"'{key}'" in message and problem in message


def test_bad_physics_file_names_the_file(tmp_path):
    path = tmp_path / "bad_physics.yaml"
    path.write_text(yaml.safe_dump(_broken(lambda raw: raw["joints"]["panda_joint5"].update(armature=-0.1))))
    with pytest.raises(PhysicsConfigError, match=r"bad_physics\.yaml: key 'joints\.panda_joint5\.armature'"):
        load_physics(path)


def test_unreadable_file_is_a_physics_config_error(tmp_path):
    with pytest.raises(PhysicsConfigError, match="cannot read"):
        load_physics(tmp_path / "missing.yaml")
    (tmp_path / "garbled.yaml").write_text("joints: [unclosed")
    with pytest.raises(PhysicsConfigError, match="garbled.yaml"):
        load_physics(tmp_path / "garbled.yaml")
