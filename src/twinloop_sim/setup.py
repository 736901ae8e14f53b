from setuptools import find_packages, setup

package_name = 'twinloop_sim'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='twinloop maintainers',
    maintainer_email='maintainers@twinloop.dev',
    description='Simulation behind the hardware contract: the emulated workcell (MuJoCo with hidden true physics) and the sim bridge.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'emulated_workcell = twinloop_sim.emulated_workcell_node:main',
            'emulated_cameras = twinloop_sim.emulated_cameras_node:main',
            'sim_bridge = twinloop_sim.sim_bridge_node:main',
            'replay_server = twinloop_sim.replay_node:main',
            'state_publisher = twinloop_sim.state_publisher_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'replay = twinloop_sim.replay_cli:main',
        ],
    },
)
