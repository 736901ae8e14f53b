from setuptools import find_packages, setup

package_name = 'twinloop_safety'

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
    description='Safety envelope monitor: the only writer of the hardware command topic (joint, velocity, Cartesian and force limits; watchdogs; latched faults).',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'envelope_monitor = twinloop_safety.envelope_monitor_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'monitor = twinloop_safety.monitor_cli:main',
        ],
    },
)
