from setuptools import find_packages, setup

package_name = 'twinloop_calibration'

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
    description='Camera intrinsics, hand-eye calibration with uncertainty, time offset, pose planner, calibration action server.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'calibration_server = twinloop_calibration.calibration_server_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'calibrate = twinloop_calibration.cli:main',
        ],
    },
)
