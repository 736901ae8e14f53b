"""twinloop_ros: the ROS glue every twinloop node and tool uses.

`node` (parameters, start-up and shutdown, executors), `qos` (the suite's QoS profiles),
`messages` (numpy <-> message conversions), `process` (nodes as processes), `session`
(a node of one's own beside the stack), `clients` (the suite's services and actions as
plain calls). `testing` is test support that production code never imports. Imports no
stage package.
"""
