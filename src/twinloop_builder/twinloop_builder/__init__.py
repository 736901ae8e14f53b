"""twinloop_builder: physics identification into new twin versions."""
