"""rclpy nodes: thin edges between ROS messages and plain omni_ros Python."""
