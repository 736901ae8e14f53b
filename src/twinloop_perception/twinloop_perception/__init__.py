"""twinloop_perception: objects tracked from the cameras (the box pose with covariance)."""
