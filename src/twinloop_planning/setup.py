from setuptools import find_packages, setup

package_name = 'twinloop_planning'

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
    description='Motion planning in the twin: collision-free joint paths (OMPL) through a twin version\'s '
                'geometry and the envelope\'s keep-out boxes, timed within the envelope\'s limits (ruckig) '
                'and checked by the envelope monitor\'s own code before a command is sent.',
    license='Apache-2.0',
    entry_points={
        # `twinloop <command>` (twinloop_bringup.cli dispatches)
        'twinloop.commands': [
            'plan = twinloop_planning.cli:main',
        ],
    },
)
