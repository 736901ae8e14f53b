"""twinloop_bringup: the node set, the launch-free bring-up and the demo; installs launch/, config/, urdf/."""
