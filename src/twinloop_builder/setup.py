from setuptools import find_packages, setup

package_name = 'twinloop_builder'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
    ],
    # mujoco.sysid needs the extra: mujoco[sysid] (absl-py, colorama, tabulate, matplotlib, ...)
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='twinloop maintainers',
    maintainer_email='maintainers@twinloop.dev',
    description='Physics identification with mujoco.sysid into new twin versions; build action server.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'twin_builder = twinloop_builder.twin_builder_node:main',
        ],
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'build = twinloop_builder.cli:main',
        ],
    },
)
