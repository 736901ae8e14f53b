"""What the launch files share: the composed workcell description and the stack's nodes.

Imported by `launch/*.launch.py` only; it needs ROS 2 `launch` and `launch_ros`, which the
PyPI wheels lack (`twinloop bringup` starts the same node set there).

- `WorkcellDescription`: robot_state_publisher's `robot_description`, composed exactly as
  the emulated workcell composes the one it publishes on /robot_description
  (`twinloop_twin.workcell.compose_workcell_urdf`: the workcell URDF around the robot's,
  one tree rooted at `world`). `urdf/workcell.urdf` alone is a fragment whose joints name
  links of the robot, and robot_state_publisher refuses it.
- `stack_launch_nodes`: launch_ros Nodes of `twinloop_bringup.node_set.STACK`, the node set
  declared once, with each node's parameter file, fixed parameters and remappings.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from launch.some_substitutions_type import SomeSubstitutionsType
from launch.substitution import Substitution
from launch.substitutions import PathJoinSubstitution
from launch.utilities import normalize_to_list_of_substitutions, perform_substitutions
from launch_ros.actions import Node

from twinloop_bringup.node_set import STACK, StackNode


class WorkcellDescription(Substitution):
    """The composed workcell URDF as a string (a launch substitution).

    `workcell_urdf`: the workcell around the robot (table, camera mounts, board, box);
    `robot_urdf`: the robot's URDF, empty for the Panda of example-robot-data.
    """

    def __init__(self, workcell_urdf: SomeSubstitutionsType, robot_urdf: SomeSubstitutionsType = "") -> None:
        super().__init__()
        self.workcell_urdf = normalize_to_list_of_substitutions(workcell_urdf)
        self.robot_urdf = normalize_to_list_of_substitutions(robot_urdf)

    def describe(self) -> str:
        return "WorkcellDescription(workcell_urdf={}, robot_urdf={})".format(
            " + ".join(s.describe() for s in self.workcell_urdf), " + ".join(s.describe() for s in self.robot_urdf))

    def perform(self, context) -> str:
        # Imported here: building a launch description (`ros2 launch -s`) needs no URDF.
        from twinloop_twin.workcell import compose_workcell_urdf

        workcell_urdf = perform_substitutions(context, self.workcell_urdf)
        robot_urdf = perform_substitutions(context, self.robot_urdf)
        return compose_workcell_urdf(workcell_urdf, robot_urdf or None)


def stack_launch_nodes(config_dir: SomeSubstitutionsType, *, common: Iterable[Mapping[str, Any]] = (),
                       overrides: Mapping[str, Mapping[str, Any]] | None = None,
                       only: Iterable[str] | None = None,
                       params_files: Mapping[str, SomeSubstitutionsType] | None = None) -> list[Node]:
    """One launch_ros Node per node of the stack (or of `only`, by name), in STACK's order.

    Parameters, later entries winning: the node's params_file under `config_dir` (or
    `params_files[name]` instead), its fixed parameters, each of `common` (e.g.
    use_sim_time), then `overrides[name]`.
    """
    overrides, params_files = overrides or {}, params_files or {}
    names = set(only) if only is not None else None
    unknown = (names or set()) - {node.name for node in STACK}
    if unknown:
        raise ValueError(f"unknown stack node(s) {sorted(unknown)}; the stack has {[n.name for n in STACK]}")
    return [_launch_node(node, config_dir, common, overrides.get(node.name, {}), params_files.get(node.name))
            for node in STACK if names is None or node.name in names]


def _launch_node(node: StackNode, config_dir: SomeSubstitutionsType, common: Iterable[Mapping[str, Any]],
                 override: Mapping[str, Any], params_file: SomeSubstitutionsType | None = None) -> Node:
    parameters: list[Any] = []
    if params_file is not None:
        parameters.append(params_file)
    elif node.params_file:
        parameters.append(PathJoinSubstitution([config_dir, node.params_file]))
    parameters += [dict(node.parameters), *(dict(c) for c in common), dict(override)]
    return Node(package=node.package, executable=node.executable, name=node.name, output="screen",
                parameters=[p for p in parameters if p], remappings=list(node.remappings))
