"""X-VLA (LeRobot 0.6.1 `xvla`): Florence-2 encoder side + a soft-prompted, domain-aware flow-matching head."""
