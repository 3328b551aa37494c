"""The whole stack on the simulated robot: `ros2 launch omni_ros sim.launch.py`."""

from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("omni_ros")
    return LaunchDescription(
        [
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(PathJoinSubstitution([share, "launch", "omni_ros.launch.py"])),
                launch_arguments={
                    "config": PathJoinSubstitution([share, "config", "sim.yaml"]),
                    "sim": "true",
                }.items(),
            )
        ]
    )
