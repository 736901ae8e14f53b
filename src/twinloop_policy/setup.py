from setuptools import find_packages, setup

package_name = 'twinloop_policy'

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
    description='Policy runner: loads an exported policy folder, checks it against the robot, runs it at its rate under the envelope monitor and runs recorded trials.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'policy_runner = twinloop_policy.policy_runner_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'policy = twinloop_policy.cli:main',
            'trials = twinloop_policy.cli:trials_main',
        ],
    },
)
