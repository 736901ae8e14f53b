"""Message definitions for the bag's schemas, so that readers without the types can decode.

rosbags' typestore knows the standard ROS 2 Kilted types and produces the concatenated
`.msg` text rosbag2 stores (and the RIHS01 type hash). Types it does not know (the
suite's own, a driver's) are read from the installed `.msg` files, found through the
ament index as rosbag2 itself would, and registered with rosbags' `.msg` parser.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.base import Nodetype

HEADER = "std_msgs/msg/Header"


class UnknownMessageType(LookupError):
    """No definition for a message type; the message says where it was looked for."""


@dataclass(frozen=True)
class TypeDefinition:
    msgtype: str     # e.g. sensor_msgs/msg/JointState
    msgdef: str      # rosbag2 'ros2msg' text: the type's .msg plus its dependencies
    rihs01: str      # RIHS01_<sha256> type description hash
    has_header: bool  # first field is std_msgs/Header (drop accounting reads its stamp)


def _share_directory(package: str) -> Path | None:
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    except ImportError:
        return None
    try:
        return Path(get_package_share_directory(package))
    except PackageNotFoundError:
        return None


class TypeResolver:
    def __init__(self, extra_msg_dirs: list[Path] | None = None) -> None:
        self.typestore = get_typestore(Stores.ROS2_KILTED)
        self._extra = [Path(d) for d in (extra_msg_dirs or [])]
        self._cache: dict[str, TypeDefinition] = {}

    def _msg_file(self, msgtype: str) -> Path:
        package, kind, name = msgtype.split("/") if msgtype.count("/") == 2 else ("", "", msgtype)
        tried = []
        roots = [d / package for d in self._extra] + [s for s in [_share_directory(package)] if s]
        for root in roots:
            candidate = root / kind / f"{name}.msg"
            tried.append(str(candidate))
            if candidate.is_file():
                return candidate
        raise UnknownMessageType(
            f"no definition of message type '{msgtype}': rosbags' ROS 2 Kilted typestore does not know it "
            f"and no .msg file was found (looked in {tried or 'the ament index: package ' + repr(package) + ' is not installed'}). "
            "Install or source the package that defines it, then start the recording again")

    def _register(self, msgtype: str) -> None:
        """Register `msgtype` and, recursively, every type it uses that the store lacks."""
        pending = [msgtype]
        while pending:
            name = pending.pop()
            if name in self.typestore.fielddefs:
                continue
            text = self._msg_file(name).read_text()
            try:
                types = get_types_from_msg(text, name)
            except Exception as error:  # rosbags raises its own parse errors
                raise UnknownMessageType(f"the .msg definition of '{name}' does not parse: {error}") from error
            self.typestore.register(types)
            for _, fields in types.values():
                for _, (node, detail) in fields:
                    pending.extend(_referenced(node, detail))

    def definition(self, msgtype: str) -> TypeDefinition:
        if msgtype in self._cache:
            return self._cache[msgtype]
        if msgtype not in self.typestore.fielddefs:
            self._register(msgtype)
        msgdef, _ = self.typestore.generate_msgdef(msgtype, ros_version=2)
        fields = self.typestore.fielddefs[msgtype][1]
        has_header = bool(fields) and fields[0][1] == (Nodetype.NAME, HEADER)
        out = TypeDefinition(msgtype, msgdef, self.typestore.hash_rihs01(msgtype), has_header)
        self._cache[msgtype] = out
        return out


def _referenced(node, detail) -> list[str]:
    if node == Nodetype.NAME:
        return [detail]
    if node in (Nodetype.ARRAY, Nodetype.SEQUENCE):
        inner, _ = detail
        return _referenced(*inner)
    return []
