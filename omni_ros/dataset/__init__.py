"""LeRobotDataset v3 folders: written from rosbag2 episodes (`omni-ros dataset export`) and read back for
`omni-ros eval --dataset`, with the robot config's own topic <-> feature mapping; no LeRobot import."""
