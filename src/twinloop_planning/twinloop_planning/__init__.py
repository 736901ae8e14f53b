"""Motion planning in the twin (pure core: no rclpy)."""
