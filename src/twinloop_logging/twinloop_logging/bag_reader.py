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

Opens rosbag2 folders (MCAP or sqlite3 storage) and ROS 1 `.bag` files through
rosbags' AnyReader; messages are rosbags message objects (same fields as the ROS ones).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import yaml
from rosbags.highlevel import AnyReader, AnyReaderError
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
        if path.is_file() and path.suffix in (".mcap", ".db3") and (path.parent / "metadata.yaml").exists():
            path = path.parent  # a file inside a rosbag2 folder: open the folder
        if path.is_dir() and not (path / "metadata.yaml").exists():
            hint = (f"if the recorder was killed, run `twinloop bag repair {path}`" if any(path.glob("*.mcap"))
                    else "expected a rosbag2 folder (with metadata.yaml) or a ROS 1 .bag file")
            raise BagCorruptError(f"{path} has no metadata.yaml: {hint}")
        if path.is_file() and path.suffix != ".bag":
            raise BagError(f"{path}: expected a rosbag2 folder (with metadata.yaml) or a ROS 1 .bag file")
        self.path = path
        self.format = "ros1" if path.suffix == ".bag" else "rosbag2"
        self._custom = self._read_custom_data() if self.format == "rosbag2" else {}
        try:
            # The Kilted typestore decodes bags that carry no message definitions (old sqlite3 bags).
            self._reader = AnyReader([path], default_typestore=get_typestore(Stores.ROS2_KILTED))
            self._reader.open()
        except (AnyReaderError, OSError, ValueError, KeyError) as error:
            hint = f"; run `twinloop bag repair {path}` to recover what was written" if self.format.startswith("rosbag2") else ""
            raise BagCorruptError(f"cannot open bag {path}: {error}{hint}") from error
        self.topics: dict[str, TopicInfo] = {}
        for connection in self._reader.connections:
            old = self.topics.get(connection.topic)
            self.topics[connection.topic] = TopicInfo(connection.topic, connection.msgtype,
                                                      connection.msgcount + (old.count if old else 0))

    def _read_custom_data(self) -> dict[str, str]:
        try:
            info = yaml.safe_load((self.path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
        except (yaml.YAMLError, KeyError, TypeError) as error:
            raise BagCorruptError(f"{self.path}/metadata.yaml is not rosbag2 metadata ({error}); "
                                  f"run `twinloop bag repair {self.path}` to rebuild it") from error
        if self.path.joinpath("metadata.yaml").exists() and info.get("storage_identifier") == "sqlite3":
            self.format = "rosbag2-sqlite3"
        elif info.get("storage_identifier") == "mcap":
            self.format = "rosbag2-mcap"
        return dict(info.get("custom_data") or {})

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
        return SessionInfo.from_json(text) if text else None

    @property
    def topic_stats(self) -> dict[str, dict]:
        text = self._custom.get("twinloop.topic_stats")
        return json.loads(text) if text else {}

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
                yield BagMessage(connection.topic, connection.msgtype, log_time, msg)
        except (AnyReaderError, OSError, ValueError) as error:
            raise BagCorruptError(f"bag {self.path} is damaged while reading: {error}; "
                                  f"run `twinloop bag repair {self.path}`") from error

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
