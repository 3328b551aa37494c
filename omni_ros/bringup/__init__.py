"""Bringing a policy up on a robot: a config made from the checkpoint (`omni-ros config init|check`) and a live
check of the ROS graph (`omni-ros doctor`)."""
