"""Action-chunk execution: timing, latency compensation, blending and safety limits (no ROS)."""
