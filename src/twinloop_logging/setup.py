from setuptools import find_packages, setup

package_name = 'twinloop_logging'

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
    description='Recorder node (topics to rosbag2 MCAP bags with session metadata and drop accounting) and bag reading for the other stages.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'recorder = twinloop_logging.recorder_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'bag = twinloop_logging.cli:main',
            'record = twinloop_logging.record_cli:main',
        ],
    },
)
