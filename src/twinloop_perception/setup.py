from setuptools import find_packages, setup

package_name = 'twinloop_perception'

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
    description='Object tracking from the cameras: the box pose with covariance from the static RGB-D camera.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'box_tracker = twinloop_perception.box_tracker_node:main',
        ],
    },
)
