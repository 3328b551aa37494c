"""A simulated planar arm on a table with colored blocks: dynamics, cameras, task and expert.

Plain Python + numpy + OpenCV, usable without ROS; `omni_ros.nodes.sim_robot_node`
puts it on the wire. Kept import-light: import the submodules you need.
"""
