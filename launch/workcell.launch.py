"""A real workcell: the vendor's driver bringup (e.g. a ros2_control launch of the robot
and realsense-ros cameras, exposing the hardware contract), robot_state_publisher, and
the twinloop stack with RViz.

    ros2 launch twinloop_bringup workcell.launch.py driver_launch:=/path/to/bringup.launch.py \
        robot_urdf:=/path/to/robot.urdf

robot_state_publisher gets the workcell description composed as the emulated workcell
composes it: urdf/workcell.urdf (table, camera mounts, board, box; its joints hang on the
robot's links) merged with the robot's URDF (run xacro first where the vendor ships one).

Nothing reaches the robot's command topic except through the envelope monitor: remap
the driver's command topic to /joint_command (position targets) or run the adapter for
ros2_control forward command controllers. No simulator resets the scene here: the policy
runner asks the operator to confirm each reset.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from twinloop_bringup.launch_support import WorkcellDescription


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    driver_launch = LaunchConfiguration('driver_launch')
    workcell_urdf = LaunchConfiguration('workcell_urdf')
    robot_urdf = LaunchConfiguration('robot_urdf')
    gui = LaunchConfiguration('gui')
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/, urdf/ and launch/'),
        DeclareLaunchArgument('driver_launch', default_value='',
                              description="the robot/camera driver's launch file; empty: the driver runs elsewhere"),
        DeclareLaunchArgument('workcell_urdf', default_value=PathJoinSubstitution([share_dir, 'urdf', 'workcell.urdf']),
                              description='URDF of the workcell around the robot (its joints name the robot links)'),
        DeclareLaunchArgument('robot_urdf', default_value='',
                              description="the robot's URDF; empty: the Panda of example-robot-data"),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(driver_launch),
                                 condition=IfCondition(PythonExpression(["'", driver_launch, "' != ''"]))),
        Node(package='robot_state_publisher', executable='robot_state_publisher', name='robot_state_publisher',
             output='screen', parameters=[{'robot_description': ParameterValue(
                 WorkcellDescription(workcell_urdf, robot_urdf), value_type=str)}]),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share_dir, 'launch', 'stack.launch.py'])),
            launch_arguments={'share_dir': share_dir, 'use_sim_time': 'false', 'gui': gui,
                              'workcell_urdf': workcell_urdf, 'robot_urdf': robot_urdf, 'simulated': 'false'}.items()),
    ])
