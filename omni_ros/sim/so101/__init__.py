"""The SO-101 arm (5 joints + gripper) in MuJoCo, touching coloured cubes on a table, seen by two cameras.

`sim.engine: so101` (config/sim_so101.yaml) puts it behind the same ROS topics, collection, training and
evaluation commands as the planar arm. Import-light: only `env`, `model` and `ik` import mujoco (and
choose the headless GL backend first, omni_ros.sim.so101.gl).
"""
