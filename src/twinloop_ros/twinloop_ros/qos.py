"""The suite's QoS profiles, defined once: what each kind of data means on the wire.

- `LATCHED`: descriptions, statuses and static transforms: the last value, kept for late
  joiners (TRANSIENT_LOCAL, depth 1).
- `RELIABLE`: services' companions, diagnostics, safety state: nothing lost, shallow.
- `COMMANDS`: command streams (policy, calibration, builder, /joint_command): each message
  is one step, so none may be lost: a lost one reads as a double step and the envelope
  monitor faults. Reliable, and deep enough that a reader held up for 4 s at 250 Hz loses
  none (10 deep lost forwarded commands; 100 deep, 0.4 s, lost steps to an envelope
  monitor held up on a loaded host).
- `STREAM`: the 500 Hz robot state: reliable so reliable subscribers (robot_state_publisher,
  recorders) match too; deep enough for bursts (catch-up ticks, as-fast-as-possible runs).
- `IMAGES`: camera streams: reliable (realsense-ros default) so both kinds of subscriber
  match; shallow, since a late frame is worth less than the next one.
- `SENSOR`: ROS's sensor-data profile (best effort) for optional streams such as /wrench.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
COMMANDS = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
STREAM = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
IMAGES = QoSProfile(depth=2, reliability=ReliabilityPolicy.RELIABLE)
SENSOR = qos_profile_sensor_data
