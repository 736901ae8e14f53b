"""The twinloop stack, whatever the workcell: recorder, envelope monitor, policy runner,
calibration server, replay server, the twin ghost, and RViz (gui:=true).

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


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    use_sim_time = LaunchConfiguration('use_sim_time')
    gui = LaunchConfiguration('gui')
    sim_time = {'use_sim_time': ParameterValue(use_sim_time, value_type=bool)}

    def config(name):
        return PathJoinSubstitution([share_dir, 'config', name])

    arguments = [
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/ and urdf/ (default: $TWINLOOP_SHARE, else the share of twinloop_bringup)'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='true when a simulator publishes /clock (sim.launch.py)'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz with config/twinloop.rviz'),
    ]
    nodes = [
        Node(package='twinloop_logging', executable='recorder', name='recorder', output='screen',
             parameters=[config('recorder.yaml'), sim_time]),
        # The only writer of /joint_command.
        Node(package='twinloop_safety', executable='envelope_monitor', name='envelope_monitor', output='screen',
             parameters=[config('envelope.yaml'), sim_time]),
        Node(package='twinloop_policy', executable='policy_runner', name='policy_runner', output='screen',
             parameters=[config('policy_runner.yaml'), sim_time]),
        Node(package='twinloop_calibration', executable='calibration_server', name='calibration_server',
             output='screen', parameters=[config('calibration.yaml'), sim_time]),
        Node(package='twinloop_sim', executable='replay_server', name='replay_server', output='screen',
             parameters=[sim_time]),
        # The twin's predicted robot (replays) as a ghost: frames prefixed ghost/.
        Node(package='robot_state_publisher', executable='robot_state_publisher', name='ghost_state_publisher',
             output='screen', remappings=[('joint_states', '/twinloop/sim/joint_states'),
                                          ('robot_description', '/ghost_state_publisher/robot_description')],
             parameters=[{'frame_prefix': 'ghost/', 'robot_description': ParameterValue(
                 EnvironmentVariable('TWINLOOP_ROBOT_DESCRIPTION', default_value=''), value_type=str)}, sim_time]),
        Node(package='rviz2', executable='rviz2', name='rviz2', output='screen',
             arguments=['-d', config('twinloop.rviz')], parameters=[sim_time], condition=IfCondition(gui)),
    ]
    return LaunchDescription([*arguments, SetEnvironmentVariable('TWINLOOP_SHARE', share_dir), *nodes])
