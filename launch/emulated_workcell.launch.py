"""The emulated workcell: MuJoCo on hidden "true" physics behind the hardware contract.

    ros2 launch twinloop_bringup emulated_workcell.launch.py
    ros2 launch twinloop_bringup emulated_workcell.launch.py truth_file:=/path/to/truth.yaml seed:=3 use_rviz:=true

Starts `emulated_workcell` (which starts its camera process itself) and, on request,
RViz. No robot_state_publisher: the emulated workcell publishes /robot_description,
/tf and /tf_static as a real workcell's driver stack does.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.conditions import IfCondition
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    params_file = LaunchConfiguration('params_file')
    truth_file = LaunchConfiguration('truth_file')
    seed = LaunchConfiguration('seed')
    cameras_enabled = LaunchConfiguration('cameras_enabled')
    use_rviz = LaunchConfiguration('use_rviz')
    log_level = LaunchConfiguration('log_level')

    arguments = [
        DeclareLaunchArgument(
            'share_dir',
            # $TWINLOOP_SHARE wins (the venv and the source tree set it); otherwise the
            # installed share of twinloop_bringup, where setup.py puts config/, urdf/, launch/.
            default_value=EnvironmentVariable('TWINLOOP_SHARE',
                                              default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/ and urdf/ '
                        '(default: $TWINLOOP_SHARE, else the share of twinloop_bringup)'),
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([share_dir, 'config', 'emulated_workcell.yaml']),
            description='ROS 2 parameter file of the emulated workcell'),
        DeclareLaunchArgument(
            'truth_file',
            default_value=PathJoinSubstitution([share_dir, 'config', 'emulated_truth.yaml']),
            description='physics YAML with the hidden true parameters; overrides params_file'),
        DeclareLaunchArgument(
            'seed', default_value='0',
            description='seed of every random draw (sensor noise); overrides params_file'),
        DeclareLaunchArgument(
            'cameras_enabled', default_value='true',
            description='render and publish the RGB-D cameras; overrides params_file'),
        DeclareLaunchArgument(
            'use_rviz', default_value='false',
            description='also start RViz'),
        DeclareLaunchArgument(
            'log_level', default_value='info',
            description='log level of the started nodes (debug, info, warn, error)'),
    ]

    emulated_workcell = Node(
        package='twinloop_sim',
        executable='emulated_workcell',
        name='emulated_workcell',
        output='screen',
        emulate_tty=True,
        # Later entries win: the launch arguments override the parameter file.
        parameters=[
            params_file,
            {
                'truth_file': truth_file,
                'seed': ParameterValue(seed, value_type=int),
                'cameras_enabled': ParameterValue(cameras_enabled, value_type=bool),
            },
        ],
        arguments=['--ros-args', '--log-level', log_level],
    )

    rviz = Node(
        package='rviz2',
        executable='rviz2',
        name='rviz2',
        output='screen',
        arguments=['--ros-args', '--log-level', log_level],
        condition=IfCondition(use_rviz),
    )

    return LaunchDescription([
        *arguments,
        # The nodes (and the camera process the workcell starts) resolve their default
        # config/ and urdf/ through this variable; an installed (non-symlink) package
        # cannot find them from its own location.
        SetEnvironmentVariable('TWINLOOP_SHARE', share_dir),
        emulated_workcell,
        rviz,
    ])
