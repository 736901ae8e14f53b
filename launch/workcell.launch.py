"""A real workcell: the vendor's driver bringup (e.g. a ros2_control launch of the robot
and realsense-ros cameras, exposing the hardware contract), robot_state_publisher, and
the twinloop stack with RViz.

    ros2 launch twinloop_bringup workcell.launch.py driver_launch:=/path/to/bringup.launch.py \
        robot_description_file:=/path/to/robot.urdf

Nothing reaches the robot's command topic except through the envelope monitor: remap
the driver's command topic to /joint_command (position targets) or run the adapter for
ros2_control forward command controllers.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import (Command, EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution,
                                  PythonExpression)
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    driver_launch = LaunchConfiguration('driver_launch')
    robot_description_file = LaunchConfiguration('robot_description_file')
    gui = LaunchConfiguration('gui')
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/, urdf/ and launch/'),
        DeclareLaunchArgument('driver_launch', default_value='',
                              description="the robot/camera driver's launch file; empty: the driver runs elsewhere"),
        DeclareLaunchArgument('robot_description_file',
                              default_value=PathJoinSubstitution([share_dir, 'urdf', 'workcell.urdf']),
                              description='URDF (or xacro) of the workcell for robot_state_publisher'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(driver_launch),
                                 condition=IfCondition(PythonExpression(["'", driver_launch, "' != ''"]))),
        Node(package='robot_state_publisher', executable='robot_state_publisher', name='robot_state_publisher',
             output='screen', parameters=[{'robot_description': ParameterValue(
                 Command(['xacro ', robot_description_file]), value_type=str)}]),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share_dir, 'launch', 'stack.launch.py'])),
            launch_arguments={'share_dir': share_dir, 'use_sim_time': 'false', 'gui': gui}.items()),
    ])
