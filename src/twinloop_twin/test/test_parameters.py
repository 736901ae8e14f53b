import math

import numpy as np
import pytest

from twinloop_twin.parameters import Parameter, ParameterError, ParameterSet


def _param(mean=1.0, std=0.1, **kw):
    base = dict(identifiable=True, unit="N*m*s/rad", source="nominal")
    base.update(kw)
    return Parameter(mean=mean, std=std, **base)


def _panda_set():
    return ParameterSet(
        {
            "joint.panda_joint1.damping": _param(1.0, 0.2),
            "actuator.panda_joint1.kp": _param(4500.0, 300.0, unit="N*m/rad"),
            "command.delay_s": _param(0.004, 0.002, unit="s", identifiable=True),
            "box.mass_kg": _param(0.5, 0.0, unit="kg", identifiable=False, note="weighed on a scale"),
        }
    )


def test_round_trip_keeps_order_and_values():
    params = _panda_set()
    again = ParameterSet.from_dict(params.to_dict())
    assert again == params
    assert list(again) == [
        "joint.panda_joint1.damping",
        "actuator.panda_joint1.kp",
        "command.delay_s",
        "box.mass_kg",
    ]
    assert again["box.mass_kg"].note == "weighed on a scale"
    assert "note" not in again.to_dict()["command.delay_s"]


def test_means_and_stds():
    params = _panda_set()
    assert params.means() == {
        "joint.panda_joint1.damping": 1.0,
        "actuator.panda_joint1.kp": 4500.0,
        "command.delay_s": 0.004,
        "box.mass_kg": 0.5,
    }
    assert params.stds()["actuator.panda_joint1.kp"] == 300.0


def test_with_updates_returns_new_set_and_keeps_original():
    params = _panda_set()
    identified = _param(0.73, 0.05, source="identified")
    updated = params.with_updates({"joint.panda_joint1.damping": identified, "box.friction": _param(0.4, 0.05, unit="")})
    assert updated["joint.panda_joint1.damping"] == identified
    assert list(updated)[0] == "joint.panda_joint1.damping"  # updated in place, order kept
    assert list(updated)[-1] == "box.friction"  # new names go at the end
    assert params["joint.panda_joint1.damping"].source == "nominal"
    assert "box.friction" not in params


def test_numpy_scalars_become_plain_floats():
    p = _param(np.float32(2.5), np.float64(0.5))
    assert type(p.mean) is float and type(p.std) is float
    assert p.mean == 2.5


@pytest.mark.parametrize(
    "mean, std, fragment",
    [
        (math.nan, 0.1, "mean is nan"),
        (math.inf, 0.1, "mean is inf"),
        (1.0, -0.1, "std is -0.1"),
        (1.0, math.nan, "std is nan"),
        (True, 0.1, "mean must be a real number"),
        ("1.0", 0.1, "mean must be a real number"),
    ],
)
def test_invalid_parameter_values_are_refused(mean, std, fragment):
    with pytest.raises(ParameterError, match=fragment):
        _param(mean, std)


def test_parameter_error_is_value_error():
    assert issubclass(ParameterError, ValueError)


def test_from_dict_errors_name_the_parameter():
    data = _panda_set().to_dict()
    data["actuator.panda_joint1.kp"]["std"] = -3.0
    with pytest.raises(ParameterError, match=r"'actuator\.panda_joint1\.kp'.*std is -3\.0.*>= 0"):
        ParameterSet.from_dict(data)

    data = _panda_set().to_dict()
    data["command.delay_s"]["mean"] = float("nan")
    with pytest.raises(ParameterError, match=r"'command\.delay_s'.*mean is nan"):
        ParameterSet.from_dict(data)


def test_from_dict_refuses_missing_and_unknown_keys():
    data = _panda_set().to_dict()
    del data["box.mass_kg"]["std"]
    with pytest.raises(ParameterError, match=r"'box\.mass_kg'.*missing key\(s\) \['std'\]"):
        ParameterSet.from_dict(data)

    data = _panda_set().to_dict()
    data["box.mass_kg"]["stdev"] = 0.1
    with pytest.raises(ParameterError, match=r"'box\.mass_kg'.*unknown key\(s\) \['stdev'\]"):
        ParameterSet.from_dict(data)

    data = _panda_set().to_dict()
    data["box.mass_kg"]["identifiable"] = "yes"
    with pytest.raises(ParameterError, match=r"'box\.mass_kg'.*identifiable"):
        ParameterSet.from_dict(data)


@pytest.mark.parametrize("name", ["mass", "Box.mass", "box..mass", "box.mass.", ".box.mass", "box mass.kg", 3])
def test_bad_names_are_refused_with_the_name(name):
    with pytest.raises(ParameterError, match=r"is not a dotted name"):
        ParameterSet({name: _param()})
    with pytest.raises(ParameterError, match=repr(name).replace(".", r"\.")):
        ParameterSet.from_dict({name: _param().to_dict()})


def test_urdf_style_names_are_accepted():
    params = ParameterSet({"joint.Panda-Joint1.friction_loss": _param()})
    assert "joint.Panda-Joint1.friction_loss" in params


def test_set_holds_only_parameters():
    with pytest.raises(ParameterError, match=r"'box\.mass_kg'.*expected a Parameter"):
        ParameterSet({"box.mass_kg": 0.5})


def test_parameter_is_frozen():
    p = _param()
    with pytest.raises(AttributeError):
        p.mean = 2.0  # type: ignore[misc]
