"""Bring up omni_ros on a robot with a full ROS 2 installation.

    ros2 launch omni_ros omni_ros.launch.py sim:=true config:=/path/to/robot.yaml

Runs the same process as `omni-ros up`, so a launch and a pip-only install
start identical nodes.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    config = LaunchConfiguration("config")
    sim = LaunchConfiguration("sim")
    default_config = PathJoinSubstitution([FindPackageShare("omni_ros"), "config", "default.yaml"])
    return LaunchDescription(
        [
            DeclareLaunchArgument("config", default_value=default_config, description="omni_ros YAML config"),
            DeclareLaunchArgument("sim", default_value="false", description="drive the simulated robot"),
            ExecuteProcess(
                cmd=["omni-ros", "up", "--config", config, "--sim"], output="screen", condition=IfCondition(sim)
            ),
            ExecuteProcess(cmd=["omni-ros", "up", "--config", config], output="screen", condition=UnlessCondition(sim)),
        ]
    )
