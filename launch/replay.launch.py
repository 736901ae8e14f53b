"""Replay a recorded run in a twin with the RViz ghost: the replay server, the ghost
robot_state_publisher (frames ghost/), RViz, and the replay goal, sent as soon as the
replay server is up (`ros2 action send_goal` waits for it).

    ros2 launch twinloop_bringup replay.launch.py bag:=bags/<trial> twin_path:=twins/emulated/v3

The replay server and the ghost are the stack's own (twinloop_bringup.node_set); the
ghost gets the workcell description composed as the emulated workcell composes it.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from twinloop_bringup.launch_support import WorkcellDescription, stack_launch_nodes


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    bag = LaunchConfiguration('bag')
    twin_path = LaunchConfiguration('twin_path')
    output_dir = LaunchConfiguration('output_dir')
    gui = LaunchConfiguration('gui')
    description = WorkcellDescription(PathJoinSubstitution([share_dir, 'urdf', 'workcell.urdf']))
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/ and urdf/'),
        DeclareLaunchArgument('bag', default_value='',
                              description='recorded run to replay (rosbag2 folder); required'),
        DeclareLaunchArgument('twin_path', default_value='', description='twin version; empty: the latest'),
        DeclareLaunchArgument('output_dir', default_value='',
                              description="folder of the twin's response bag; empty: the replay server's output_dir"),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        *stack_launch_nodes(PathJoinSubstitution([share_dir, 'config']),
                            only=('replay_server', 'ghost_state_publisher'),
                            overrides={'ghost_state_publisher': {
                                'robot_description': ParameterValue(description, value_type=str)}}),
        Node(package='rviz2', executable='rviz2', name='rviz2', output='screen',
             arguments=['-d', PathJoinSubstitution([share_dir, 'config', 'twinloop.rviz'])],
             condition=IfCondition(gui)),
        ExecuteProcess(
            name='replay_goal', output='screen',
            cmd=['ros2', 'action', 'send_goal', '--feedback', '/replay_server/replay', 'twinloop_interfaces/action/Replay',
                 ['{bag_path: "', bag, '", twin_path: "', twin_path, '", output_dir: "', output_dir,
                  '", real_time: true}']]),
    ])
