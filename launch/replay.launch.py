"""Replay a recorded run in a twin with the RViz ghost: the replay server, a ghost
robot_state_publisher (frames ghost/), RViz, and the replay goal sent once everything is up.

    ros2 launch twinloop_bringup replay.launch.py bag:=bags/<trial> twin_path:=twins/emulated/v3
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, TimerAction
from launch.conditions import IfCondition
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    bag = LaunchConfiguration('bag')
    twin_path = LaunchConfiguration('twin_path')
    gui = LaunchConfiguration('gui')
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/ and urdf/'),
        DeclareLaunchArgument('bag', default_value='',
                              description='recorded run to replay (rosbag2 folder); required'),
        DeclareLaunchArgument('twin_path', default_value='', description='twin version; empty: the latest'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        Node(package='twinloop_sim', executable='replay_server', name='replay_server', output='screen'),
        Node(package='robot_state_publisher', executable='robot_state_publisher', name='ghost_state_publisher',
             output='screen', remappings=[('joint_states', '/twinloop/sim/joint_states'),
                                          ('robot_description', '/ghost_state_publisher/robot_description')],
             parameters=[{'frame_prefix': 'ghost/', 'robot_description': ParameterValue(
                 EnvironmentVariable('TWINLOOP_ROBOT_DESCRIPTION', default_value=''), value_type=str)}]),
        Node(package='rviz2', executable='rviz2', name='rviz2', output='screen',
             arguments=['-d', PathJoinSubstitution([share_dir, 'config', 'twinloop.rviz'])],
             condition=IfCondition(gui)),
        TimerAction(period=3.0, actions=[ExecuteProcess(
            cmd=['ros2', 'action', 'send_goal', '--feedback', '/replay_server/replay', 'twinloop_interfaces/action/Replay',
                 ['{bag_path: "', bag, '", twin_path: "', twin_path, '", real_time: true}']],
            output='screen')]),
    ])
