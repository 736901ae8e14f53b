"""The twinloop stack, whatever the workcell: the node set of twinloop_bringup.node_set
(recorder, envelope monitor, policy runner, calibration server, twin builder, replay
server, the twin ghost's robot_state_publisher) and RViz (gui:=true).

Included by workcell.launch.py (a real robot), emulated.launch.py (the emulated workcell)
and sim.launch.py (a twin in MuJoCo or Isaac Sim); not meant to be launched alone.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.conditions import IfCondition
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from twinloop_bringup.launch_support import WorkcellDescription, stack_launch_nodes


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    use_sim_time = LaunchConfiguration('use_sim_time')
    gui = LaunchConfiguration('gui')
    workcell_urdf = LaunchConfiguration('workcell_urdf')
    robot_urdf = LaunchConfiguration('robot_urdf')
    reset_service = LaunchConfiguration('reset_service')
    simulated = LaunchConfiguration('simulated')
    envelope_file = LaunchConfiguration('envelope_file')
    tracker_calibration = LaunchConfiguration('tracker_calibration')
    config_dir = PathJoinSubstitution([share_dir, 'config'])
    sim_time = {'use_sim_time': ParameterValue(use_sim_time, value_type=bool)}

    arguments = [
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/ and urdf/ '
                        '(default: $TWINLOOP_SHARE, else the share of twinloop_bringup)'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='true when a simulator publishes /clock (sim.launch.py)'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz with config/twinloop.rviz'),
        DeclareLaunchArgument('workcell_urdf', default_value=PathJoinSubstitution([share_dir, 'urdf', 'workcell.urdf']),
                              description='the workcell around the robot, composed with robot_urdf for the ghost'),
        DeclareLaunchArgument('robot_urdf', default_value='',
                              description="the robot's URDF; empty: the Panda of example-robot-data"),
        DeclareLaunchArgument('simulated', default_value='true',
                              description='true: a simulator resets the scene between trials (reset_service); '
                                          'false (hardware): the policy runner asks the operator to confirm'),
        DeclareLaunchArgument('reset_service', default_value='/emulated_workcell/reset',
                              description="the simulator's ResetWorkcell service (when simulated)"),
        DeclareLaunchArgument('envelope_file', default_value=PathJoinSubstitution([share_dir, 'config', 'envelope.yaml']),
                              description="the envelope monitor's parameter file (limits, workspace, keep-out boxes); "
                                          'the policy runner and the calibration server plan within it too'),
        DeclareLaunchArgument('tracker_calibration', default_value='',
                              description="an eye-to-hand calibration of the box tracker's camera (twinloop calibrate); "
                                          'empty: the URDF mount'),
    ]
    envelope_config = ParameterValue(envelope_file, value_type=str)
    overrides = {
        'policy_runner': {
            'simulated': ParameterValue(simulated, value_type=bool),
            'reset_service': ParameterValue(reset_service, value_type=str),
            'envelope_config': envelope_config,
        },
        'calibration_server': {'envelope_config': envelope_config},
        'box_tracker': {'calibration_file': ParameterValue(tracker_calibration, value_type=str)},
        # The twin's predicted robot (replays) as a ghost: the same description the
        # workcell publishes, frames prefixed ghost/.
        'ghost_state_publisher': {
            'robot_description': ParameterValue(WorkcellDescription(workcell_urdf, robot_urdf), value_type=str),
        },
    }
    nodes = stack_launch_nodes(config_dir, common=[sim_time], overrides=overrides,
                               params_files={'envelope_monitor': envelope_file})
    rviz = Node(package='rviz2', executable='rviz2', name='rviz2', output='screen',
                arguments=['-d', PathJoinSubstitution([share_dir, 'config', 'twinloop.rviz'])],
                parameters=[sim_time], condition=IfCondition(gui))
    return LaunchDescription([*arguments, SetEnvironmentVariable('TWINLOOP_SHARE', share_dir), *nodes, rviz])
