from setuptools import find_packages, setup

package_name = 'twinloop_twin'

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
    description='The twin data model: versioned immutable twin bundles with provenance, physical parameters with uncertainty, the workcell description and the MuJoCo scene builder.',
    license='Apache-2.0',
    entry_points={
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'twin = twinloop_twin.cli:main',
        ],
    },
)
