"""Posed RGB-D frames from a scan bag: the wrist camera's color + depth, paired by stamp,
each posed by forward kinematics of the joint states at its stamp and the camera mount
(the URDF's, or an eye-in-hand calibration's). Only frames taken while the arm stood
still are kept (every joint's median speed within 50 ms of the stamp below `max_joint_speed_rad_s`): a frame
taken in motion is posed from joint states a few ms off its exposure. Pure Python."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from twinloop_calibration.calibration_io import CalibrationFileError, read_camera_mount
from twinloop_twin.contract import ContractTopics
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.physics import ALL_JOINTS
from twinloop_twin.workcell import WorkcellDescription

from twinloop_builder.geometry.fusion import FusionError, PosedFrame, ScanBagNotFound


def scan_frames(bag_path: Path | str, workcell: WorkcellDescription, *, camera: str = "wrist_camera",
                calibration_file: Path | str | None = None, max_joint_speed_rad_s: float = 0.01,
                every: int = 1) -> list[PosedFrame]:
    from twinloop_logging.bag_reader import BagError, BagNotFoundError, open_bag  # rosbags import is slow; only here

    if camera not in workcell.cameras:
        raise FusionError(f"camera '{camera}' is not in the workcell; cameras: {sorted(workcell.cameras)}")
    intrinsics = workcell.cameras[camera]
    topics = ContractTopics.camera(camera)
    kinematics = UrdfTransforms(workcell.urdf_xml)
    parent, parent_T_camera = _camera_mount(workcell, camera, calibration_file)
    try:
        with open_bag(bag_path) as bag:
            for topic in (topics["color"], topics["depth"], "/joint_states"):
                if topic not in bag.topics or bag.topics[topic].count == 0:
                    raise FusionError(f"bag {bag_path} has no {topic} messages: record the scan with "
                                      "`twinloop build excite --kind scan` (the 'scan' recording profile)")
            info = bag.camera_info(topics["color_info"]) if topics["color_info"] in bag.topics else None
            camera_matrix = info.k[-1] if info is not None else np.array(intrinsics.camera_matrix)
            states = bag.joint_states("/joint_states", list(ALL_JOINTS))
            state_t = states.stamps_ns.astype(np.int64)

            def still(stamp: int) -> bool:
                if not state_t[0] <= stamp <= state_t[-1]:
                    return False
                near = np.abs(state_t - stamp) <= 50_000_000  # 50 ms around the exposure
                # per joint, the median speed over the window (sensor noise spikes do not count)
                speed = np.median(np.abs(np.nan_to_num(states.velocity[near])), axis=0).max() if near.any() else np.inf
                return speed <= max_joint_speed_rad_s

            depth = {stamp: pixels for index, (stamp, _, pixels) in enumerate(bag.iter_images(topics["depth"]))
                     if index % every == 0 and still(stamp)}
            frames = []
            for stamp, _, color in bag.iter_images(topics["color"]):
                if stamp not in depth:
                    continue
                joints = {j: float(np.interp(stamp, state_t, states.position[:, c])) for c, j in enumerate(ALL_JOINTS)}
                world_T_camera = kinematics.world_T_link(parent, joints) @ parent_T_camera
                frames.append(PosedFrame(color, depth.pop(stamp), camera_matrix, world_T_camera, name=f"{camera}@{stamp}"))
    except BagNotFoundError as error:
        raise ScanBagNotFound(str(error)) from error
    except BagError as error:
        raise FusionError(str(error)) from error
    if not frames:
        raise FusionError(f"bag {bag_path}: no {camera} frame was taken with the arm still (joint speed under "
                          f"{max_joint_speed_rad_s} rad/s): record the scan with its holds")
    return frames


def _camera_mount(workcell: WorkcellDescription, camera: str,
                  calibration_file: Path | str | None) -> tuple[str, np.ndarray]:
    """(the link the camera is mounted on, link_T_camera optical frame)."""
    frame = workcell.cameras[camera].color_optical_frame
    if calibration_file is None:
        return frame, np.eye(4)
    try:
        return read_camera_mount(calibration_file, "eye_in_hand")
    except CalibrationFileError as error:
        raise FusionError(str(error)) from error
