"""The embedded default: the emulated workcell (MuJoCo on hidden true physics, a stand-in
for hardware behind the hardware contract) with the whole twinloop stack and RViz.

    ros2 launch twinloop_bringup emulated.launch.py [truth_file:=...] [gui:=false]

Without ROS 2 launch (the PyPI wheels), `twinloop bringup` starts the same node set.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    truth_file = LaunchConfiguration('truth_file')
    gui = LaunchConfiguration('gui')
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/, urdf/ and launch/'),
        DeclareLaunchArgument('truth_file',
                              default_value=PathJoinSubstitution([share_dir, 'config', 'emulated_truth.yaml']),
                              description='hidden true physics of the emulated workcell'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share_dir, 'launch', 'emulated_workcell.launch.py'])),
            launch_arguments={'share_dir': share_dir, 'truth_file': truth_file, 'use_rviz': 'false'}.items()),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share_dir, 'launch', 'stack.launch.py'])),
            launch_arguments={'share_dir': share_dir, 'use_sim_time': 'false', 'gui': gui,
                              # the emulated workcell resets the scene between trials
                              'simulated': 'true', 'reset_service': '/emulated_workcell/reset'}.items()),
    ])
