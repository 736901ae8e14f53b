from glob import glob

from setuptools import find_packages, setup

package_name = 'twinloop_bringup'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        # The workspace's top-level launch/, config/ and urdf/ (design: ROS users expect
        # them at the top), installed as this package's share so that
        # `ros2 launch twinloop_bringup ...` and FindPackageShare('twinloop_bringup') find them.
        # Relative to this directory: colcon runs setup.py here, and in --symlink-install
        # from build/twinloop_bringup/, which is as deep as src/twinloop_bringup/ in a
        # standard workspace, so '../..' names the workspace root from both.
        ('share/' + package_name + '/launch', sorted(glob('../../launch/*.launch.py'))),
        ('share/' + package_name + '/config',
         sorted(glob('../../config/*.yaml') + glob('../../config/*.xml') + glob('../../config/*.rviz'))),
        ('share/' + package_name + '/urdf', sorted(glob('../../urdf/*.urdf'))),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='twinloop maintainers',
    maintainer_email='maintainers@twinloop.dev',
    description='The workcell bring-up: launch files, parameter files and URDF of the suite, the node set, the launch-free bring-up and the demo.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'twinloop = twinloop_bringup.cli:main',
        ],
        'twinloop.commands': [
            'bringup = twinloop_bringup.bringup:main',
            'demo = twinloop_bringup.demo:main',
        ],
    },
)
