"""Rosbag replay evaluation: recorded episodes -> the robot's own observation assembly and policy -> metrics.

Offline (`replay.py`): every inference instant is assembled by the policy node's `ObservationAssembler`
from the messages logged up to that instant, the policy predicts a chunk, and the chunk is scored
against the recorded commands that follow. Real time (`realtime.py`): the bag is played to a running
policy node over ROS and what the node publishes is scored the same way.

Kept free of heavy imports: `omni_ros.config` imports `omni_ros.eval.config`.
"""
