"""Serve a twin in Isaac Sim over twinloop's hardware contract. Runs INSIDE Isaac Sim:

    ./python.sh -m twinloop_sim.isaac_twin_bridge --usd twins/emulated/v3/twin.usda [--headless]

(the USD comes from `twinloop twin export-usd`). It opens the stage, applies the twin's
physics that UsdPhysics cannot express (joint friction loss, armature, mimic finger,
command delay; written as `twinloop:` attributes by twinloop_twin.usd_export), and wires
the Isaac Sim ROS 2 bridge to the same topics as the emulated workcell and the MuJoCo sim
bridge: /joint_states, /joint_command (delayed by the twin's command delay), both cameras'
color/depth/camera_info, and /clock. This file is not run in twinloop's test suite (Isaac
Sim is not installable there); test/test_isaac_bridge.py checks the USD it consumes and
that every topic below is the contract's.
"""
from __future__ import annotations

import argparse
import collections
import sys

# The hardware contract's topic names (twinloop_twin.contract.ContractTopics); literal here
# because Isaac Sim's Python need not have twinloop installed. A test keeps them equal.
JOINT_STATES = "/joint_states"
JOINT_COMMAND = "/joint_command"
CLOCK = "/clock"
CAMERA_TOPICS = {"color": "/{camera}/color/image_raw", "color_info": "/{camera}/color/camera_info",
                 "depth": "/{camera}/depth/image_rect_raw", "depth_info": "/{camera}/depth/camera_info"}
ARTICULATION = "/World/twin/panda_link0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--usd", required=True, help="twin USD written by twinloop_twin.usd_export")
    parser.add_argument("--headless", action="store_true")
    args = parser.parse_args(argv)
    try:
        from isaacsim import SimulationApp
    except ImportError:
        print("isaac_twin_bridge runs inside Isaac Sim: start it with Isaac Sim's python.sh "
              "(see docker/ for an image). Outside Isaac Sim use the MuJoCo sim bridge: "
              "ros2 run twinloop_sim sim_bridge --ros-args -p twin_path:=...", file=sys.stderr)
        return 2
    app = SimulationApp({"headless": args.headless})
    import omni.graph.core as og
    import omni.usd
    from isaacsim.core.api import World
    from isaacsim.core.prims import SingleArticulation
    from isaacsim.core.utils.extensions import enable_extension
    from isaacsim.core.utils.types import ArticulationAction
    from pxr import PhysxSchema, UsdGeom

    enable_extension("isaacsim.ros2.bridge")
    omni.usd.get_context().open_stage(args.usd)
    stage = omni.usd.get_context().get_stage()
    delay_s = apply_twin_physics(stage, PhysxSchema)
    world = World(stage_units_in_meters=1.0)
    robot = SingleArticulation(ARTICULATION)
    world.reset()
    robot.initialize()
    cameras = [prim for prim in stage.Traverse() if prim.IsA(UsdGeom.Camera) and prim.HasAttribute("twinloop:width")]
    build_ros_graph(og, cameras)
    commands = DelayedCommands(delay_s, robot.dof_names)
    start_command_subscriber(commands)
    while app.is_running():
        world.step(render=True)
        due = commands.due(world.current_time)
        if due is not None:
            robot.apply_action(ArticulationAction(joint_positions=due))
    app.close()
    return 0


def apply_twin_physics(stage, PhysxSchema) -> float:
    """Joint friction/armature and the mimic finger from the `twinloop:` attributes."""
    for prim in stage.Traverse():
        if prim.HasAttribute("twinloop:frictionLoss"):
            joint = PhysxSchema.PhysxJointAPI.Apply(prim)
            joint.CreateJointFrictionAttr(prim.GetAttribute("twinloop:frictionLoss").Get())
            joint.CreateArmatureAttr(prim.GetAttribute("twinloop:armature").Get())
        if prim.HasAttribute("twinloop:mimicJoint"):
            mimic = PhysxSchema.PhysxMimicJointAPI.Apply(prim, "rotX")
            mimic.CreateReferenceJointRel().SetTargets([prim.GetPath().GetParentPath().AppendChild(
                prim.GetAttribute("twinloop:mimicJoint").Get())])
            mimic.CreateGearingAttr(-1.0)
    root = stage.GetPrimAtPath("/World/twin")
    return float(root.GetAttribute("twinloop:commandDelay_s").Get() or 0.0)


class DelayedCommands:
    """Position commands applied `delay_s` after they arrive, as the twin's actuators do."""

    def __init__(self, delay_s: float, dof_names: list[str]) -> None:
        self.delay_s, self.dof_names = delay_s, list(dof_names)
        self.queue: collections.deque = collections.deque()
        self.targets: list[float] | None = None
        self.now = 0.0

    def push(self, names: list[str], positions: list[float]) -> None:
        unknown = [n for n in names if n not in self.dof_names]
        if unknown:  # refused whole, as on every twinloop boundary
            print(f"rejected /joint_command: unknown joints {unknown}; joints are {self.dof_names}", file=sys.stderr)
            return
        self.queue.append((self.now + self.delay_s, dict(zip(names, positions))))

    def due(self, now: float):
        self.now = now
        applied = None
        while self.queue and self.queue[0][0] <= now:
            _, command = self.queue.popleft()
            base = self.targets or [0.0] * len(self.dof_names)
            self.targets = [command.get(n, base[i]) for i, n in enumerate(self.dof_names)]
            applied = self.targets
        return applied


def start_command_subscriber(commands: DelayedCommands) -> None:
    import threading

    import rclpy
    from sensor_msgs.msg import JointState
    rclpy.init()
    node = rclpy.create_node("isaac_twin_bridge")
    node.create_subscription(JointState, JOINT_COMMAND, lambda m: commands.push(list(m.name), list(m.position)), 10)
    threading.Thread(target=rclpy.spin, args=(node,), daemon=True).start()


def build_ros_graph(og, cameras) -> None:
    nodes = [("tick", "omni.graph.action.OnPlaybackTick"), ("sim_time", "isaacsim.core.nodes.IsaacReadSimulationTime"),
             ("clock", "isaacsim.ros2.bridge.ROS2PublishClock"),
             ("joint_states", "isaacsim.ros2.bridge.ROS2PublishJointState")]
    values = [("clock.inputs:topicName", CLOCK), ("joint_states.inputs:topicName", JOINT_STATES),
              ("joint_states.inputs:targetPrim", ARTICULATION)]
    connections = [("tick.outputs:tick", "clock.inputs:execIn"), ("tick.outputs:tick", "joint_states.inputs:execIn"),
                   ("sim_time.outputs:simulationTime", "clock.inputs:timeStamp"),
                   ("sim_time.outputs:simulationTime", "joint_states.inputs:timeStamp")]
    for prim in cameras:
        camera = prim.GetName()
        width, height = prim.GetAttribute("twinloop:width").Get(), prim.GetAttribute("twinloop:height").Get()
        frame = prim.GetAttribute("twinloop:opticalFrame").Get()
        product = f"{camera}_render"
        nodes.append((product, "isaacsim.core.nodes.IsaacCreateRenderProduct"))
        values += [(f"{product}.inputs:cameraPrim", str(prim.GetPath())), (f"{product}.inputs:width", width),
                   (f"{product}.inputs:height", height)]
        connections.append(("tick.outputs:tick", f"{product}.inputs:execIn"))
        for kind, helper, render_type in (("color", "ROS2CameraHelper", "rgb"),
                                          ("depth", "ROS2CameraHelper", "depth"),
                                          ("color_info", "ROS2CameraInfoHelper", None),
                                          ("depth_info", "ROS2CameraInfoHelper", None)):
            name = f"{camera}_{kind}"
            nodes.append((name, f"isaacsim.ros2.bridge.{helper}"))
            values += [(f"{name}.inputs:topicName", CAMERA_TOPICS[kind].format(camera=camera)),
                       (f"{name}.inputs:frameId", frame)]
            if render_type:
                values.append((f"{name}.inputs:type", render_type))
            connections += [(f"{product}.outputs:execOut", f"{name}.inputs:execIn"),
                            (f"{product}.outputs:renderProductPath", f"{name}.inputs:renderProductPath")]
    og.Controller.edit({"graph_path": "/World/twinloop_ros", "evaluator_name": "execution"},
                       {og.Controller.Keys.CREATE_NODES: nodes, og.Controller.Keys.SET_VALUES: values,
                        og.Controller.Keys.CONNECT: connections})


if __name__ == "__main__":
    sys.exit(main())
