from setuptools import find_packages, setup

package_name = 'twinloop_validation'

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
    description='Validation: held-out trials on the robot scored against a twin version.',
    license='Apache-2.0',
    entry_points={
        'twinloop.commands': [
            'loop = twinloop_validation.loop:main',
            'validate = twinloop_validation.cli:main',
        ],
    },
)
