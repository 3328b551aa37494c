"""Bring up omni_ros on a robot with a full ROS 2 installation.

    ros2 launch omni_ros omni_ros.launch.py config:=/path/to/robot.yaml
    ros2 launch omni_ros omni_ros.launch.py sim:=true bridge:=true

One process per node (`omni-ros node NAME`), the same nodes `omni-ros up
--processes` starts on a pip-only install: the policy node, and optionally the
simulated robot, the OpenPI bridge and the voice-feedback node.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def node(name: str, condition=None, sim: bool = False) -> ExecuteProcess:
    cmd = ["omni-ros", "node", name, "--config", LaunchConfiguration("config")]
    if sim:
        cmd.append("--sim")
    return ExecuteProcess(cmd=cmd, name=f"omni_ros_{name}", output="screen", condition=condition)


def generate_launch_description() -> LaunchDescription:
    sim = LaunchConfiguration("sim")
    default_config = PathJoinSubstitution([FindPackageShare("omni_ros"), "config", "default.yaml"])
    return LaunchDescription(
        [
            DeclareLaunchArgument("config", default_value=default_config, description="omni_ros YAML config"),
            DeclareLaunchArgument("sim", default_value="false", description="start the simulated robot"),
            DeclareLaunchArgument("bridge", default_value="false", description="serve the OpenPI WebSocket bridge"),
            DeclareLaunchArgument("tts", default_value="false", description="start the voice-feedback node"),
            node("policy", condition=UnlessCondition(sim)),
            node("policy", condition=IfCondition(sim), sim=True),
            node("sim", condition=IfCondition(sim)),
            node("bridge", condition=IfCondition(LaunchConfiguration("bridge"))),
            node("tts", condition=IfCondition(LaunchConfiguration("tts"))),
        ]
    )
