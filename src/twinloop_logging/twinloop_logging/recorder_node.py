"""Recorder node: records a profile's topics into a rosbag2 (MCAP) bag per session.

Services ~/start, ~/stop, ~/annotate; latched ~/status (RecordingStatus) while recording.
Messages are taken serialized (raw) with QoS matched to their publishers, counted
(drops.py) and handed to the writer thread (recording.py); nothing is deserialized.
"""
from __future__ import annotations

import importlib
import sys
import time

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from twinloop_ros.qos import LATCHED
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from twinloop_interfaces.msg import ErrorCode, RecordingStatus, SessionId, TopicStats
from twinloop_interfaces.srv import AnnotateRecording, StartRecording, StopRecording

from twinloop_logging.bag_writer import BagOptionError
from twinloop_logging.drops import DeclaredRateError, parse_declared_rates
from twinloop_logging.profiles import ProfileError, load_profiles, select_profile
from twinloop_logging.recording import RecordingOptions, RecordingSnapshot, SessionWriter
from twinloop_logging.session import BagExistsError, SessionError, bag_path_for, new_session
from twinloop_logging.typedefs import TypeResolver, UnknownMessageType
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_twin.workcell import default_config_dir

DRAIN_MAX = 200  # messages of one topic taken per callback before the other topics get a turn
# The emulated workcell's cameras (camera_rate_hz in config/emulated_workcell.yaml).
CAMERAS_DECLARED = "/(wrist|static)_camera/(color|depth)/(image_raw|image_rect_raw|camera_info)=15.0"



class Recorder(Node):
    def __init__(self) -> None:
        super().__init__("recorder")
        self.p = declare(self, {
            "profiles_file": ("", "recording profiles YAML; empty: config/recording.yaml"),
            "output_dir": ("bags", "parent folder of new bags when a request gives none"),
            "robot": ("emulated_panda", "robot name stored in every session"),
            "discovery_period_s": (0.5, "s, how often the graph is searched for new matching topics"),
            "status_period_s": (1.0, "s, period of the latched ~/status while recording"),
            "queue_depth": (1000, "KEEP_LAST depth of every subscription, messages (1 s of a 1 kHz stream)"),
            "chunk_size_bytes": (4194304, "MCAP chunk size, bytes"),
            "flush_interval_s": (1.0, "s, the chunk being filled reaches the file at least this often"),
            "max_queue_bytes": (536870912, "bytes waiting for the disk before the recorder drops (and counts)"),
            "autostart_profile": ("", "record this profile from startup; empty: wait for ~/start"),
            "autostart_purpose": ("demonstration", "autostart session purpose"),
            "autostart_split": ("fit", "autostart session split (fit | held_out)"),
            "autostart_session_id": ("", "autostart session id; empty: generated"),
            "autostart_note": ("", "autostart operator note"),
            "split_size_bytes": (0, "autostart: split files at this size, bytes; 0: no size split"),
            "split_duration_s": (0.0, "autostart: split files after this long, s; 0: no duration split"),
            "compress": (False, "autostart: zstd chunk compression"),
            "declared_rates": ([CAMERAS_DECLARED], "'REGEX=HZ': the rate sources matching REGEX (re.fullmatch) are "
                               "declared at; stamp gaps against it are frames the source skipped"),
        })
        try:
            self.profiles = load_profiles(self.p["profiles_file"] or default_config_dir() / "recording.yaml")
            self.declared_rates = parse_declared_rates(self.p["declared_rates"])
        except (ProfileError, DeclaredRateError) as error:
            raise StartupError(str(error)) from error
        self.types = TypeResolver()
        self.recording: SessionWriter | None = None
        self.profile = None
        self.subs: dict = {}
        self.last_status = RecordingStatus(message="idle")
        self.status_pub = self.create_publisher(RecordingStatus, "~/status", LATCHED)
        self.create_service(StartRecording, "~/start", self.on_start)
        self.create_service(StopRecording, "~/stop", self.on_stop)
        self.create_service(AnnotateRecording, "~/annotate", self.on_annotate)
        self.create_timer(self.p["discovery_period_s"], self.discover)
        self.create_timer(self.p["status_period_s"], self.publish_status)
        if self.p["autostart_profile"]:
            request = StartRecording.Request(
                profile=self.p["autostart_profile"], operator_note=self.p["autostart_note"],
                session=SessionId(session_id=self.p["autostart_session_id"], purpose=self.p["autostart_purpose"],
                                  split=self.p["autostart_split"]),
                split_size_bytes=self.p["split_size_bytes"], split_duration_s=self.p["split_duration_s"],
                compress=self.p["compress"])
            error = self.on_start(request, StartRecording.Response()).error
            if error.code != ErrorCode.NONE:
                raise StartupError(error.message)

    # -- services ------------------------------------------------------------------------
    def on_start(self, request, response):
        if self.recording is not None:
            response.error = ErrorCode(code=ErrorCode.NOT_READY, message=f"already recording {self.recording.path}; "
                                       "call ~/stop first")
            return response
        try:
            profile = select_profile(self.profiles, request.profile)
            s = request.session
            session = new_session(s.purpose, s.split, session_id=s.session_id, robot=self.p["robot"],
                                  profile=profile.name, operator_note=request.operator_note,
                                  twin_version=request.twin_version, policy_version=request.policy_version,
                                  trial_index=s.trial_index)
            path = bag_path_for(request.output_dir or self.p["output_dir"], session, unique=not s.session_id)
            self.recording = SessionWriter(path, session, RecordingOptions(
                request.compress, request.split_size_bytes, request.split_duration_s, self.p["chunk_size_bytes"],
                self.p["flush_interval_s"], self.p["max_queue_bytes"]))
        except (ProfileError, SessionError, BagExistsError, BagOptionError, OSError) as error:
            code = ErrorCode.FILE_NOT_FOUND if type(error) is FileNotFoundError else ErrorCode.INVALID_ARGUMENT
            response.error = ErrorCode(code=code, message=str(error))
            self.get_logger().error(f"start refused: {error}")
            return response
        self.profile = profile
        self.discover()
        self.publish_status()  # at once: a client waits for the topics it needs (policy runner)
        self.get_logger().info(f"recording profile '{profile.name}' into {path}")
        response.error = ErrorCode(code=ErrorCode.NONE, message="")
        response.bag_path, response.session_id = str(path), session.session_id
        return response

    def on_stop(self, request, response):
        if self.recording is None:
            response.error = ErrorCode(code=ErrorCode.NOT_READY, message="not recording; nothing to stop")
            return response
        failed = self.recording.failed
        response.status = self.finish("stopped by ~/stop")
        # A session that failed earlier (storage full) still returns its bag and counts.
        response.error = ErrorCode(code=ErrorCode.UNKNOWN if failed else ErrorCode.NONE, message=failed or "")
        response.bag_path = response.status.bag_path
        return response

    def on_annotate(self, request, response):
        if self.recording is None or not request.note.strip():
            why = "not recording; start a session first" if self.recording is None else "empty note"
            response.error = ErrorCode(code=ErrorCode.NOT_READY if self.recording is None
                                       else ErrorCode.INVALID_ARGUMENT, message=why)
            return response
        self.recording.annotate(request.note)
        response.error = ErrorCode(code=ErrorCode.NONE, message="")
        return response

    # -- recording -----------------------------------------------------------------------
    def discover(self) -> None:
        if self.recording is None:
            return
        added = False
        for topic, types in self.get_topic_names_and_types():
            if topic in self.subs or topic in self.recording.skipped or not self.profile.matches(topic):
                continue
            publishers = self.get_publishers_info_by_topic(topic)
            if not publishers:
                continue  # QoS to match is unknown until a publisher shows up
            if len(types) != 1:
                self.skip(topic, f"published with several types {types}; rosbag2 records one type per topic")
                continue
            try:
                definition = self.types.definition(types[0])
                msg_class = get_message(types[0])
            except (UnknownMessageType, AttributeError, ModuleNotFoundError, ValueError) as error:
                self.skip(topic, str(error))
                continue
            qos = [p.qos_profile for p in publishers]
            account = self.recording.add_topic(topic, definition, [_rosbags_qos(q) for q in qos])
            rate_hz = next((hz for pattern, hz in self.declared_rates if pattern.fullmatch(topic)), 0.0)
            if rate_hz:
                account.declare_rate(rate_hz)
            self.subscribe(topic, msg_class, qos)
            added = True
        if added:  # say so now, not at the next status period: clients wait for their topics
            self.publish_status()

    def subscribe(self, topic: str, msg_class, offered) -> None:
        every = lambda attr, value: all(getattr(q, attr) == value for q in offered)  # noqa: E731
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST,
                         depth=max([self.p["queue_depth"]] + [q.depth for q in offered]),
                         reliability=ReliabilityPolicy.RELIABLE if every("reliability", ReliabilityPolicy.RELIABLE)
                         else ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL
                         if every("durability", DurabilityPolicy.TRANSIENT_LOCAL) else DurabilityPolicy.VOLATILE)
        put, lost = self.recording.put, self.recording.accounts[topic].on_lost

        def keep(data, info) -> None:
            gid = info.get("publisher_gid")
            put(topic, data, info["received_timestamp"] or time.time_ns(), info["source_timestamp"],
                bytes(gid["data"]) if gid else None, info.get("publication_sequence_number"))

        def on_message(data, info) -> None:
            keep(data, info)
            # Take what else waits here (as rclpy.wait_for_message takes): the executor rebuilds
            # its wait set in Python for every message it hands out, which costs more than the
            # message, so a recorder woken late took a 1 kHz stream slower than it arrived.
            sub = self.subs[topic]
            for _ in range(DRAIN_MAX):
                with sub.handle:
                    taken = sub.handle.take_message(sub.msg_type, True)
                if taken is None:
                    return
                keep(*taken)
        # DDS sample-lost events (rclpy skips event types the middleware does not support).
        events = SubscriptionEventCallbacks(message_lost=lambda status: lost(status.total_count_change))
        self.subs[topic] = self.create_subscription(msg_class, topic, on_message, qos, raw=True,
                                                    event_callbacks=events)

    def skip(self, topic: str, why: str) -> None:
        self.recording.skip_topic(topic, why)
        self.get_logger().error(f"not recording {topic}: {why}")

    def finish(self, reason: str) -> RecordingStatus:
        for sub in self.subs.values():
            self.destroy_subscription(sub)
        self.subs = {}
        recording, self.recording = self.recording, None
        snapshot = recording.stop(reason, expected_topics=list(self.profile.topics))
        self.last_status = self.status_msg(snapshot, recording)
        self.status_pub.publish(self.last_status)
        self.get_logger().info(f"bag {snapshot.bag_path} closed: {snapshot.message}")
        return self.last_status

    def publish_status(self) -> None:
        if self.recording is not None and self.recording.failed:
            self.get_logger().error(f"recording stopped: {self.recording.failed}")
            self.finish(self.recording.failed)
        elif self.recording is not None:
            self.status_pub.publish(self.status_msg(self.recording.snapshot(), self.recording))

    def status_msg(self, snapshot: RecordingSnapshot, recording: SessionWriter) -> RecordingStatus:
        s = recording.session
        msg = RecordingStatus(recording=snapshot.recording, bag_path=snapshot.bag_path, profile=s.profile,
                              session=SessionId(session_id=s.session_id, purpose=s.purpose, split=s.split,
                                                trial_index=s.trial_index),
                              duration_s=snapshot.duration_s, bytes_written=snapshot.bytes_written,
                              split_index=snapshot.split_index, message=snapshot.message)
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.topics = [TopicStats(topic=c.topic, type=c.type, received=c.received, expected=c.expected,
                                 dropped_estimate=c.dropped_estimate, lost_reported=c.lost_reported,
                                 rate_hz=c.rate_hz, source_skipped=c.source_skipped) for c in snapshot.topics]
        return msg

    def destroy_node(self) -> None:
        if self.recording is not None:  # SIGINT / SIGTERM / shutdown: finalize the bag
            self.finish("recorder shut down")
        super().destroy_node()


def get_message(msgtype: str):
    """The Python class of 'pkg/msg/Type' (rosidl_runtime_py, which does this, is not in the wheels)."""
    package, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def _rosbags_qos(q) -> Qos:
    """rclpy QoS (what a publisher offers) as rosbags writes it into metadata.yaml."""
    def duration(d) -> QosTime:
        ns = d.nanoseconds
        return QosTime(min(ns // 1_000_000_000, 2147483647), ns % 1_000_000_000 if ns < 2**62 else 4294967295)
    return Qos(QosHistory(int(q.history)), q.depth, QosReliability(int(q.reliability)),
               QosDurability(int(q.durability)), duration(q.deadline), duration(q.lifespan),
               QosLiveliness(int(q.liveliness)), duration(q.liveliness_lease_duration),
               q.avoid_ros_namespace_conventions)


def main(args=None) -> None:
    # The writer thread holds the GIL in slices; shorter slices let the thread taking
    # messages from DDS back in before a publisher's KEEP_LAST history overflows.
    sys.setswitchinterval(0.001)
    # SingleThreadedExecutor: the wheels' EventsExecutor fails in spin_once ("SystemError:
    # null argument to internal routine") on raw subscriptions with message info.
    run_node(Recorder, args)


if __name__ == "__main__":
    main()
