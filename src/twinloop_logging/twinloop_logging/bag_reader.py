"""Reading bags for the other stages (calibration, identification, validation). No rclpy.

    from twinloop_logging.bag_reader import open_bag
    with open_bag("bags/20261202T153000Z-emulated-identification") as bag:
        bag.topics                      # {name: TopicInfo(name, type, count)}
        bag.session                     # SessionInfo (purpose, split, versions...) or None
        bag.topic_stats                 # {topic: {received, expected, dropped_estimate, ...}} or {}
        for m in bag.messages(["/joint_states"]):   # BagMessage(topic, type, log_time_ns, msg)
            ...
        js = bag.joint_states()         # JointStateSeries: stamps_ns, names, position (N, J), ...
        q_at_frames = js.at(bag.images("/wrist_camera/color/image_raw").stamps_ns).position

Opens rosbag2 folders (MCAP or sqlite3 storage), bare `.mcap` / `.db3` files (as `ros2 bag
info` does) and ROS 1 `.bag` files through rosbags' AnyReader; messages are rosbags message
objects (same fields as the ROS ones). Damage found while reading (a chunk whose CRC fails,
a message that does not decode) is a BagCorruptError naming `twinloop bag repair`;
`twinloop_logging.integrity.check_bag` finds it without reading messages one by one.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import yaml
from rosbags.highlevel import AnyReader, AnyReaderError
from rosbags.rosbag1 import ReaderError as Ros1ReaderError
from rosbags.rosbag2 import ReaderError as Ros2ReaderError
from rosbags.serde import SerdeError
from rosbags.typesys import Stores, get_typestore

from twinloop_logging.session import SESSION_KEY, SessionInfo

JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
WRENCH = "geometry_msgs/msg/WrenchStamped"
IMU = "sensor_msgs/msg/Imu"
_PIXELS = {"rgb8": (np.uint8, 3), "bgr8": (np.uint8, 3), "rgba8": (np.uint8, 4), "bgra8": (np.uint8, 4),
           "mono8": (np.uint8, 1), "8UC1": (np.uint8, 1), "mono16": (np.uint16, 1), "16UC1": (np.uint16, 1),
           "32FC1": (np.float32, 1)}


# What rosbags raises on a damaged bag (the format's own errors, and what the parsers
# meet in garbled bytes: lengths past the end, broken strings).
_READ_ERRORS = (AnyReaderError, Ros1ReaderError, Ros2ReaderError, SerdeError, OSError, ValueError, KeyError,
                IndexError, TypeError, struct.error, EOFError)
_DECODE_ERRORS = (SerdeError, AnyReaderError, ValueError, IndexError, TypeError, struct.error, EOFError, OverflowError)
_STORAGE_SUFFIXES = (".mcap", ".db3")
# libyaml's parser where PyYAML has it: a recorder's metadata.yaml parses in 12 ms, not 77 ms
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BagError(Exception):
    """Base of the reader's errors; each message says what was wrong and what to do."""


class BagNotFoundError(BagError, FileNotFoundError):
    pass


class BagCorruptError(BagError):
    pass


class MissingTopicError(BagError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownMessageTypeError(BagError):
    pass


@dataclass(frozen=True)
class TopicInfo:
    name: str
    type: str
    count: int


@dataclass(frozen=True)
class BagMessage:
    topic: str
    type: str
    log_time_ns: int   # when the recorder received it
    msg: object        # rosbags message object


def stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def interpolate(stamps_ns: np.ndarray, values: np.ndarray, query_ns, *, max_gap_s: float | None = None) -> np.ndarray:
    """Linear interpolation of `values` (N, ...) sampled at `stamps_ns` (N, increasing) at
    `query_ns` (M,). NaN outside the sampled span and, with max_gap_s, inside gaps longer than it."""
    stamps = np.asarray(stamps_ns, dtype=np.int64)
    query = np.atleast_1d(np.asarray(query_ns, dtype=np.int64))
    values = np.asarray(values, dtype=float)
    flat = values.reshape(len(stamps), -1)
    if len(stamps) == 0:
        return np.full((len(query),) + values.shape[1:], np.nan)
    t = (stamps - stamps[0]) * 1e-9
    tq = (query - stamps[0]) * 1e-9
    out = np.stack([np.interp(tq, t, column, left=np.nan, right=np.nan) for column in flat.T], axis=1)
    if max_gap_s is not None and len(stamps) > 1:
        right = np.clip(np.searchsorted(stamps, query, side="left"), 1, len(stamps) - 1)
        gap = (stamps[right] - stamps[right - 1]) * 1e-9
        out[(gap > max_gap_s) & (query != stamps[right])] = np.nan
    return out.reshape((len(query),) + values.shape[1:])


def nearest(stamps_ns: np.ndarray, query_ns, *, tolerance_s: float) -> np.ndarray:
    """Index of the sample nearest each query stamp, -1 where none is within tolerance."""
    stamps = np.asarray(stamps_ns, dtype=np.int64)
    query = np.atleast_1d(np.asarray(query_ns, dtype=np.int64))
    if len(stamps) == 0:
        return np.full(len(query), -1)
    right = np.clip(np.searchsorted(stamps, query), 0, len(stamps) - 1)
    left = np.clip(right - 1, 0, len(stamps) - 1)
    pick = np.where(np.abs(stamps[left] - query) <= np.abs(stamps[right] - query), left, right)
    return np.where(np.abs(stamps[pick] - query) <= tolerance_s * 1e9, pick, -1)


@dataclass
class JointStateSeries:
    stamps_ns: np.ndarray   # (N,) header stamps
    names: list[str]
    position: np.ndarray    # (N, J); NaN where a message lacks the joint
    velocity: np.ndarray
    effort: np.ndarray

    def at(self, query_ns, *, max_gap_s: float | None = 0.1) -> "JointStateSeries":
        """The series linearly interpolated at other stamps (e.g. camera frames)."""
        query = np.atleast_1d(np.asarray(query_ns, dtype=np.int64))
        return JointStateSeries(query, list(self.names),
                                *(interpolate(self.stamps_ns, a, query, max_gap_s=max_gap_s)
                                  for a in (self.position, self.velocity, self.effort)))


@dataclass
class ImageSeries:
    stamps_ns: np.ndarray   # (N,)
    frame_id: str
    encoding: str
    frames: np.ndarray      # (N, H, W) or (N, H, W, C)


@dataclass
class CameraInfoSeries:
    stamps_ns: np.ndarray
    frame_id: str
    width: int
    height: int
    distortion_model: str
    k: np.ndarray           # (N, 3, 3)
    d: np.ndarray           # (N, len(D))


@dataclass
class WrenchSeries:
    stamps_ns: np.ndarray
    frame_id: str
    force: np.ndarray       # (N, 3) N
    torque: np.ndarray      # (N, 3) N m


@dataclass
class ImuSeries:
    stamps_ns: np.ndarray
    frame_id: str
    orientation_xyzw: np.ndarray      # (N, 4)
    angular_velocity: np.ndarray      # (N, 3) rad/s
    linear_acceleration: np.ndarray   # (N, 3) m/s^2


def image_to_numpy(msg) -> np.ndarray:
    if msg.encoding not in _PIXELS:
        raise BagError(f"image encoding '{msg.encoding}' is not supported (supported: {sorted(_PIXELS)})")
    dtype, channels = _PIXELS[msg.encoding]
    dtype = np.dtype(dtype).newbyteorder(">" if msg.is_bigendian else "<")
    row = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(msg.height, msg.step)
    pixels = row[:, :msg.width * channels * dtype.itemsize].copy().view(dtype)
    shape = (msg.height, msg.width) if channels == 1 else (msg.height, msg.width, channels)
    return pixels.reshape(shape).astype(dtype.newbyteorder("="))


class Bag:
    """An open bag; use as a context manager or call close()."""

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        if not path.exists():
            raise BagNotFoundError(f"no bag at {path}")
        if path.is_file() and path.suffix in _STORAGE_SUFFIXES and (path.parent / "metadata.yaml").exists():
            path = path.parent  # a file inside a rosbag2 folder: open the folder
        if path.is_dir() and not (path / "metadata.yaml").exists():
            hint = (f"if the recorder was killed, run `twinloop bag repair {path}`" if any(path.glob("*.mcap"))
                    else "expected a rosbag2 folder (with metadata.yaml), an .mcap or .db3 file, or a ROS 1 .bag file")
            raise BagCorruptError(f"{path} has no metadata.yaml: {hint}")
        if path.is_file() and path.suffix not in (".bag",) + _STORAGE_SUFFIXES:
            raise BagError(f"{path}: expected a rosbag2 folder (with metadata.yaml), an .mcap or .db3 file, "
                           "or a ROS 1 .bag file")
        self.path = path
        if path.suffix == ".bag":
            self.format, self._custom = "ros1", {}
        elif path.is_file():
            self.format = "mcap" if path.suffix == ".mcap" else "sqlite3"
            self._custom = self._read_file_metadata() if self.format == "mcap" else {}
        else:
            self.format = "rosbag2"
            self._custom = self._read_custom_data()
        try:
            # The Kilted typestore decodes bags that carry no message definitions (old sqlite3 bags).
            self._reader = AnyReader([path], default_typestore=get_typestore(Stores.ROS2_KILTED))
            self._reader.open()
            self.topics: dict[str, TopicInfo] = {}
            for connection in self._reader.connections:
                old = self.topics.get(connection.topic)
                self.topics[connection.topic] = TopicInfo(connection.topic, connection.msgtype,
                                                          int(connection.msgcount) + (old.count if old else 0))
            self.message_count  # noqa: B018 - read now: a malformed count is an error at open, not later
        except _READ_ERRORS as error:
            raise BagCorruptError(f"cannot open bag {path}: {_one_line(error)}{self._repair_hint()}") from error

    def _repair_hint(self) -> str:
        if self.format == "rosbag2-mcap" or self.format == "rosbag2" and any(self.path.glob("*.mcap")):
            return f"; run `twinloop bag repair {self.path}` to recover what was written"
        if self.format == "mcap":
            return "; to recover what was written, move the file into a folder of its own and run " \
                   "`twinloop bag repair <folder>`"
        return ""

    def _read_custom_data(self) -> dict[str, str]:
        where = self.path / "metadata.yaml"
        hint = f"run `twinloop bag repair {self.path}` to rebuild it"
        try:
            info = yaml.load(where.read_text(), Loader=_YAML_LOADER)["rosbag2_bagfile_information"]
        except (yaml.YAMLError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise BagCorruptError(f"{where} is not rosbag2 metadata ({_one_line(error)}); {hint}") from error
        if not isinstance(info, dict):
            raise BagCorruptError(f"{where} is not rosbag2 metadata (no rosbag2_bagfile_information mapping); {hint}")
        count = info.get("message_count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise BagCorruptError(f"{where}: message_count is {count!r}, not a count; {hint}")
        custom = info.get("custom_data") or {}
        if not isinstance(custom, dict) or not all(isinstance(v, str) for v in custom.values()):
            raise BagCorruptError(f"{where}: custom_data must map names to strings, got {custom!r}; {hint}")
        if info.get("storage_identifier") == "sqlite3":
            self.format = "rosbag2-sqlite3"
        elif info.get("storage_identifier") == "mcap":
            self.format = "rosbag2-mcap"
        for key in (SESSION_KEY, "twinloop.topic_stats"):
            if key in custom:
                try:
                    json.loads(custom[key])
                except ValueError as error:
                    raise BagCorruptError(f"{where}: custom_data {key} is not valid JSON ({error}); {hint}") from error
        return {str(k): v for k, v in custom.items()}

    def _read_file_metadata(self) -> dict[str, str]:
        """A bare MCAP file: the session the recorder stored in its metadata records."""
        from mcap.exceptions import McapError
        from mcap.reader import make_reader
        try:
            with open(self.path, "rb") as stream:
                records = {r.name: r.metadata for r in make_reader(stream).iter_metadata()}
        except (McapError, OSError, ValueError, struct.error, EOFError):
            return {}  # no readable summary: AnyReader says what is wrong below
        session = records.get(SESSION_KEY, {}).get("json")
        return {SESSION_KEY: session} if session else {}

    # -- metadata ------------------------------------------------------------------------
    @property
    def start_ns(self) -> int:
        return self._reader.start_time

    @property
    def end_ns(self) -> int:
        return self._reader.end_time

    @property
    def message_count(self) -> int:
        return self._reader.message_count

    @property
    def custom_data(self) -> dict[str, str]:
        return dict(self._custom)

    @property
    def session(self) -> SessionInfo | None:
        text = self._custom.get(SESSION_KEY)
        if not text:
            return None
        try:
            return SessionInfo.from_json(text)
        except (ValueError, TypeError, AttributeError) as error:
            raise BagCorruptError(f"bag {self.path}: its session metadata ({SESSION_KEY}) is malformed "
                                  f"({_one_line(error)}); run `twinloop bag repair {self.path}`") from error

    @property
    def topic_stats(self) -> dict[str, dict]:
        text = self._custom.get("twinloop.topic_stats")
        stats = json.loads(text) if text else {}
        return stats if isinstance(stats, dict) else {}

    def require(self, topic: str, msgtype: str | None = None) -> TopicInfo:
        if topic not in self.topics:
            raise MissingTopicError(f"topic '{topic}' is not in bag {self.path}; it has {sorted(self.topics)}")
        info = self.topics[topic]
        if msgtype and info.type != msgtype:
            raise BagError(f"topic '{topic}' in {self.path} holds {info.type}, not {msgtype}")
        return info

    # -- messages ------------------------------------------------------------------------
    def messages(self, topics: list[str] | None = None, *, start_ns: int | None = None,
                 end_ns: int | None = None, raw: bool = False) -> Iterator[BagMessage]:
        """Typed messages in log-time order (optionally of some topics, in [start, end));
        with raw=True, `msg` is the serialized CDR bytes (any type, no definition needed)."""
        for topic in topics or []:
            self.require(topic)
        connections = [c for c in self._reader.connections if topics is None or c.topic in topics]
        try:
            for connection, log_time, data in self._reader.messages(connections=connections,
                                                                   start=start_ns, stop=end_ns):
                if raw:
                    yield BagMessage(connection.topic, connection.msgtype, log_time, bytes(data))
                    continue
                try:
                    msg = self._reader.deserialize(data, connection.msgtype)
                except KeyError as error:
                    raise UnknownMessageTypeError(
                        f"topic '{connection.topic}' holds {connection.msgtype}, whose definition is neither "
                        f"in the bag nor a standard ROS 2 type; read it with messages(raw=True), or record it "
                        f"where its package is installed so that the bag carries its definition") from error
                except _DECODE_ERRORS as error:
                    raise BagCorruptError(
                        f"bag {self.path}: a message on '{connection.topic}' (log time {log_time} ns) does not "
                        f"decode as {connection.msgtype} ({_one_line(error)}); the bag is damaged"
                        f"{self._repair_hint() or ''}") from error
                yield BagMessage(connection.topic, connection.msgtype, log_time, msg)
        except _READ_ERRORS as error:
            raise BagCorruptError(f"bag {self.path} is damaged: {_one_line(error)} while reading"
                                  f"{self._repair_hint() or ''}") from error

    def _typed(self, topic: str, msgtype: str) -> list:
        self.require(topic, msgtype)
        return [m.msg for m in self.messages([topic])]

    def joint_states(self, topic: str = "/joint_states", joints: list[str] | None = None) -> JointStateSeries:
        msgs = self._typed(topic, JOINT_STATE)
        names = list(joints) if joints else (list(msgs[0].name) if msgs else [])
        arrays = {f: np.full((len(msgs), len(names)), np.nan) for f in ("position", "velocity", "effort")}
        for row, msg in enumerate(msgs):
            index = {n: i for i, n in enumerate(msg.name)}
            columns = [(c, index[n]) for c, n in enumerate(names) if n in index]
            for field, array in arrays.items():
                values = getattr(msg, field)
                if len(values) == len(msg.name):
                    for c, i in columns:
                        array[row, c] = values[i]
        stamps = np.array([stamp_ns(m) for m in msgs], dtype=np.int64)
        order = np.argsort(stamps, kind="stable")
        return JointStateSeries(stamps[order], names, *(arrays[f][order] for f in ("position", "velocity", "effort")))

    def iter_images(self, topic: str) -> Iterator[tuple[int, str, np.ndarray]]:
        """(stamp_ns, frame_id, pixels) per frame, without holding the whole stream in memory."""
        self.require(topic, IMAGE)
        for m in self.messages([topic]):
            yield stamp_ns(m.msg), m.msg.header.frame_id, image_to_numpy(m.msg)

    def images(self, topic: str, *, every: int = 1, max_frames: int | None = None) -> ImageSeries:
        stamps, frames, frame_id, encoding = [], [], "", ""
        self.require(topic, IMAGE)
        for i, m in enumerate(self.messages([topic])):
            if i % every:
                continue
            stamps.append(stamp_ns(m.msg))
            frames.append(image_to_numpy(m.msg))
            frame_id, encoding = m.msg.header.frame_id, m.msg.encoding
            if max_frames and len(frames) >= max_frames:
                break
        return ImageSeries(np.array(stamps, dtype=np.int64), frame_id, encoding,
                           np.stack(frames) if frames else np.zeros((0, 0, 0)))

    def camera_info(self, topic: str) -> CameraInfoSeries:
        msgs = self._typed(topic, CAMERA_INFO)
        if not msgs:
            raise MissingTopicError(f"topic '{topic}' in {self.path} has no message")
        last = msgs[-1]
        return CameraInfoSeries(np.array([stamp_ns(m) for m in msgs], dtype=np.int64), last.header.frame_id,
                                int(last.width), int(last.height), last.distortion_model,
                                np.array([np.asarray(m.k, dtype=float).reshape(3, 3) for m in msgs]),
                                np.array([np.asarray(m.d, dtype=float) for m in msgs]))

    def wrenches(self, topic: str = "/wrench") -> WrenchSeries:
        msgs = self._typed(topic, WRENCH)
        vec = lambda v: (v.x, v.y, v.z)  # noqa: E731
        return WrenchSeries(np.array([stamp_ns(m) for m in msgs], dtype=np.int64),
                            msgs[-1].header.frame_id if msgs else "",
                            np.array([vec(m.wrench.force) for m in msgs], dtype=float).reshape(-1, 3),
                            np.array([vec(m.wrench.torque) for m in msgs], dtype=float).reshape(-1, 3))

    def imu(self, topic: str) -> ImuSeries:
        msgs = self._typed(topic, IMU)
        vec = lambda v: (v.x, v.y, v.z)  # noqa: E731
        return ImuSeries(np.array([stamp_ns(m) for m in msgs], dtype=np.int64),
                         msgs[-1].header.frame_id if msgs else "",
                         np.array([(m.orientation.x, m.orientation.y, m.orientation.z, m.orientation.w)
                                   for m in msgs], dtype=float).reshape(-1, 4),
                         np.array([vec(m.angular_velocity) for m in msgs], dtype=float).reshape(-1, 3),
                         np.array([vec(m.linear_acceleration) for m in msgs], dtype=float).reshape(-1, 3))

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "Bag":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_bag(path: Path | str) -> Bag:
    return Bag(path)


def _one_line(error: BaseException) -> str:
    """An error's text on one line (YAML errors span several, with a caret drawing)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"
    text = " ".join(str(error).split())
    return text or type(error).__name__
