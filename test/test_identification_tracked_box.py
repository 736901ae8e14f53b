"""Identification's push stage from the box as the static camera sees it, against ground truth.

The emulated workcell's simulation plays the shipped pushes and lift under config/emulated_truth.yaml;
the static camera is rendered at the emulated cameras' rate with that truth's sensor noise
and every frame goes through the box tracker. The same session is identified twice: with
the tracked poses (what a real cell has, the default) and with the simulator's ground-truth
poses (which only a test may read); both are scored against the truth file.
"""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede `import mujoco`

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

from twinloop_builder import identification as ident  # noqa: E402
from twinloop_builder.excitation import (WorkspaceChecker, box_excitation, load_excitation_config,  # noqa: E402
                                         motion_limits)
from twinloop_builder.synthetic import simulate_session  # noqa: E402
from twinloop_perception.box_tracking import BoxTracker, BoxTrackerSettings, Pinhole  # noqa: E402
from twinloop_perception.camera_pose import world_T_camera  # noqa: E402
from twinloop_sim.workcell_sim import CameraRig  # noqa: E402
from twinloop_twin.nominal import physics_parameters  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.scene import build_workcell_spec, compile_workcell  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

PRODUCT = "box.mass_kg*box.friction"


def tracked_and_true_sessions(workcell, nominal, truth, *, seed: int = 5):
    """The default box excitation played on `truth` in-process, recorded twice: with the box
    poses the tracker finds in the static camera's frames (rendered at the emulated cameras'
    rate with the truth's sensor noise) and with the simulator's own (bench/box_identification.py
    --tracked uses this too)."""
    config_dir = default_config_dir()
    rate_hz = yaml.safe_load((config_dir / "emulated_workcell.yaml").read_text())[
        "/**/emulated_workcell"]["ros__parameters"]["camera_rate_hz"]
    camera = workcell.cameras["static_camera"]
    tracker = BoxTracker(BoxTrackerSettings(size_m=tuple(workcell.box.size_m),
                                            table_height_m=workcell.table_top_height_m),
                         Pinhole(camera.width, camera.height, camera.fx, camera.fy, camera.cx, camera.cy),
                         world_T_camera(workcell, "static_camera"))
    model = compile_workcell(workcell, truth)
    rig = CameraRig(model, {"static_camera": camera}, truth.noise, seed=2)
    spec = build_workcell_spec(workcell, nominal)
    excitation = load_excitation_config(config_dir / "excitation.yaml")
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    max_speed, max_acceleration = motion_limits(excitation.joints, workcell.urdf_xml)
    segments = box_excitation(excitation, workcell.box.size_m[0] / 2, workcell.home_joint_positions, checker,
                              max_speed=max_speed, max_acceleration=max_acceleration)
    tracked_t, tracked_pose, due = [], [], [0.0]

    def on_chunk(sim) -> None:
        if sim.time_s + 1e-9 < due[0]:
            return
        due[0] += 1.0 / rate_hz
        rig.set_state(sim.data.qpos)
        estimate = tracker.update(*rig.render("static_camera"))
        if estimate.found:
            x, y, z, w = Rotation.from_matrix(estimate.world_T_box[:3, :3]).as_quat()
            tracked_t.append(sim.time_s)
            tracked_pose.append([*estimate.world_T_box[:3, 3], w, x, y, z])

    try:
        session = simulate_session(workcell, truth, segments, seed=seed, on_chunk=on_chunk)
    finally:
        rig.close()
    tracked = dataclasses.replace(session, box_t=np.array(tracked_t), box_pose=np.array(tracked_pose),
                                  box_source="tracked")
    print(f"{len(tracked_t)} tracked frames at {rate_hz} Hz, ground truth {len(session.box_t)} poses")
    return tracked, session


def test_push_stage_from_tracked_box_poses_within_10_percent_of_the_truth():
    config_dir = default_config_dir()
    workcell = load_workcell()
    nominal = load_physics(config_dir / "nominal_physics.yaml")
    truth = load_physics(config_dir / "emulated_truth.yaml")
    spec = build_workcell_spec(workcell, nominal)
    tracked, session = tracked_and_true_sessions(workcell, nominal, truth)

    truth_values = physics_parameters(truth, source="truth").means()
    truth_values[PRODUCT] = truth_values["box.mass_kg"] * truth_values["box.friction"]
    prior = dict(physics_parameters(truth, source="truth").means())  # the arm as identified (here: known)
    for name in ident.BOX_PARAMETERS:
        prior[name] = physics_parameters(nominal, source="nominal").means()[name]
    results = {}
    for source, recording in (("tracked", tracked), ("ground truth", session)):
        result = ident.identify(spec, prior, [recording], select=list(ident.BOX_PARAMETERS),
                                settings=ident.IdentificationSettings())
        results[source] = {**{n: result.estimates[n] for n in ident.BOX_PARAMETERS}, PRODUCT: result.derived[PRODUCT]}
        for name, estimate in results[source].items():
            print(f"{source}: {name} {estimate.mean:.4f} +- {estimate.std:.4f} (truth {truth_values[name]:.4f}, "
                  f"{estimate.mean / truth_values[name] - 1:+.1%}), "
                  f"{'identifiable' if estimate.identifiable else 'not identifiable'}")
    # mass x friction within 10 % of the truth from tracked poses
    assert abs(results["tracked"][PRODUCT].mean / truth_values[PRODUCT] - 1) <= 0.10
    # and no worse than 5 points of ratio from what ground truth gives
    assert abs(results["tracked"][PRODUCT].mean / results["ground truth"][PRODUCT].mean - 1) <= 0.05
    # mass and friction apart (the lift): both identified within 5 % from tracked poses
    for name in ("box.mass_kg", "box.friction"):
        estimate = results["tracked"][name]
        assert estimate.identifiable and abs(estimate.mean / truth_values[name] - 1) <= 0.05, (name, estimate)
    for name, estimate in results["tracked"].items():  # whatever is claimed identifiable holds
        if estimate.identifiable:
            assert estimate.ci_low <= truth_values[name] <= estimate.ci_high, (name, estimate)
