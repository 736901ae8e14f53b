"""A twin version in simulation, on simulated time, with the twinloop stack and RViz:
MuJoCo through the sim bridge, or Isaac Sim through its ROS 2 bridge.

    ros2 launch twinloop_bringup sim.launch.py twin_path:=twins/emulated/v3 [simulator:=isaac]

What differs per simulator follows the `simulator` argument: which process serves the
hardware contract, and the reset service the policy runner resets trials with (the sim
bridge's ~/reset; Isaac Sim's bridge serves none, so there the operator confirms resets).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

# Whether the simulator's bridge resets the scene (ResetWorkcell); Isaac Sim's serves none.
RESETS_SCENE = {'mujoco': True, 'isaac': False}


def generate_launch_description() -> LaunchDescription:
    share_dir = LaunchConfiguration('share_dir')
    simulator = LaunchConfiguration('simulator')
    twin_path = LaunchConfiguration('twin_path')
    real_time = LaunchConfiguration('real_time')
    isaac_python = LaunchConfiguration('isaac_python')
    twin_usd = LaunchConfiguration('twin_usd')
    gui = LaunchConfiguration('gui')
    is_mujoco = IfCondition(PythonExpression(["'", simulator, "' == 'mujoco'"]))
    is_isaac = IfCondition(PythonExpression(["'", simulator, "' == 'isaac'"]))
    simulated = PythonExpression([repr(RESETS_SCENE), "['", simulator, "']"])
    return LaunchDescription([
        DeclareLaunchArgument(
            'share_dir',
            default_value=EnvironmentVariable('TWINLOOP_SHARE', default_value=FindPackageShare('twinloop_bringup')),
            description='folder holding twinloop config/, urdf/ and launch/'),
        DeclareLaunchArgument('simulator', default_value='mujoco', choices=sorted(RESETS_SCENE),
                              description='mujoco: the sim bridge; isaac: Isaac Sim with its ROS 2 bridge'),
        DeclareLaunchArgument('twin_path', default_value='twins/emulated/v0', description='twin version folder'),
        DeclareLaunchArgument('real_time', default_value='true',
                              description='mujoco: pace to the wall clock; false: as fast as possible'),
        DeclareLaunchArgument('isaac_python', default_value='/isaac-sim/python.sh',
                              description="isaac: Isaac Sim's python launcher"),
        DeclareLaunchArgument('twin_usd', default_value=PathJoinSubstitution([twin_path, 'twin.usda']),
                              description='isaac: the twin exported with `twinloop twin export-usd`'),
        DeclareLaunchArgument('gui', default_value='true', description='start RViz'),
        Node(package='twinloop_sim', executable='sim_bridge', name='sim_bridge', output='screen', condition=is_mujoco,
             parameters=[{'twin_path': twin_path, 'real_time': ParameterValue(real_time, value_type=bool)}]),
        ExecuteProcess(cmd=[isaac_python, '-m', 'twinloop_sim.isaac_twin_bridge', '--usd', twin_usd],
                       name='isaac_twin_bridge', output='screen', condition=is_isaac),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([share_dir, 'launch', 'stack.launch.py'])),
            launch_arguments={'share_dir': share_dir, 'use_sim_time': 'true', 'gui': gui,
                              'simulated': simulated, 'reset_service': '/sim_bridge/reset'}.items()),
    ])
