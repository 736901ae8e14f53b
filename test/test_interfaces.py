"""The suite's interfaces import, serialize, and keep their error-code sets consistent."""
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from tf2_msgs.msg import TFMessage
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode, SessionId, SystemStatus
from twinloop_interfaces.srv import ResetWorkcell


def _constants(msg_type, prefix=""):
    return {name: getattr(msg_type, name) for name in dir(msg_type)
            if name.isupper() and name.startswith(prefix) and name != "SLOT_TYPES"}


@pytest.mark.parametrize("msg_type, prefix", [
    (ErrorCode, ""), (EnvelopeStatus, "FAULT_"), (EnvelopeStatus, "STATE_"), (SystemStatus, "LEVEL_")])
def test_constant_sets_have_unique_values(msg_type, prefix):
    constants = _constants(msg_type, prefix)
    assert constants, f"{msg_type.__name__} has no {prefix}* constants"
    assert len(set(constants.values())) == len(constants)


def test_error_codes_cover_what_the_contract_checks_raise():
    from twinloop_twin.contract import CommandRejected, parse_joint_command
    for names, positions in ([["x"], [0.0]], [["panda_joint1"], [float("nan")]], [[], []]):
        with pytest.raises(CommandRejected) as error:
            parse_joint_command(names, positions, ["panda_joint1"])
        assert hasattr(ErrorCode, error.value.code)


def test_messages_round_trip_through_serialization():
    status = SystemStatus(component="emulated_workcell", level=SystemStatus.LEVEL_WARN, message="slow",
                          session=SessionId(session_id="s1", purpose=SessionId.PURPOSE_TRIAL,
                                            split=SessionId.SPLIT_HELD_OUT, trial_index=3))
    back = deserialize_message(serialize_message(status), SystemStatus)
    assert back.session.split == "held_out" and back.session.trial_index == 3 and back.level == 1
    envelope = EnvelopeStatus(state=EnvelopeStatus.STATE_FAULT, fault=EnvelopeStatus.FAULT_KEEP_OUT,
                              reason="hand entered keep-out box 'camera_stand'", joint_names=["panda_joint4"])
    assert deserialize_message(serialize_message(envelope), EnvelopeStatus) == envelope
    response = ResetWorkcell.Response(error=ErrorCode(code=ErrorCode.UNKNOWN_JOINT, message="elbow"))
    assert deserialize_message(serialize_message(response), ResetWorkcell.Response).error.code == 200
    assert deserialize_message(serialize_message(TFMessage()), TFMessage).transforms == []
