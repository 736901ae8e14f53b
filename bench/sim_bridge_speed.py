"""Benchmark: sim bridge real-time factor (with and without cameras) and replay speed vs raw
MuJoCo stepping of the same twin model, measured in one run.

    .venv/bin/python bench/sim_bridge_speed.py [--window-s 6]

Prints the ratios; the goal for replay is >= 0.7x raw stepping.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import mujoco
import numpy as np
from rosgraph_msgs.msg import Clock

from twinloop_sim.replay import RecordedRun, replay
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.nominal import build_nominal_twin, load_scene, load_twin_workcell


def raw_stepping(model: mujoco.MjModel, sim_s: float) -> float:
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    steps = int(sim_s / model.opt.timestep)
    start = time.perf_counter()
    mujoco.mj_step(model, data, nstep=steps)
    return sim_s / (time.perf_counter() - start)


def replay_speed(twin, sim_s: float) -> float:
    workcell = load_twin_workcell(twin)
    sim = WorkcellSimulation(workcell, model=load_scene(twin))
    home = workcell.home_joint_positions
    t = np.arange(0.0, sim_s, 0.002)
    q = np.tile([home[n] for n in sim.joint_names], (len(t), 1))
    commands = [(float(c), {"panda_joint1": home["panda_joint1"] + 0.3 * np.sin(c)}) for c in np.arange(0, sim_s, 0.01)]
    run = RecordedRun(list(sim.joint_names), t, q, commands)
    start = time.perf_counter()
    replay(run, sim, UrdfTransforms(workcell.urdf_xml))
    return sim_s / (time.perf_counter() - start)


def bridge_rtf(twin, cameras: bool, window_s: float) -> float:
    domain = fresh_domain_id()
    process = NodeProcess("twinloop_sim.sim_bridge_node", domain,
                          {"twin_path": str(twin.path), "real_time": False, "cameras_enabled": cameras})
    probe = RosProbe(domain)
    try:
        clock = probe.collect(Clock, "/clock", qos=1000, transform=lambda m: m.clock.sec + m.clock.nanosec * 1e-9)
        probe.wait_for(lambda: len(clock) > 10, 60.0, "/clock")
        time.sleep(2.0 if cameras else 0.5)  # cameras start rendering after their process is up
        first_wall, first_sim = clock[-1]
        time.sleep(window_s)
        last_wall, last_sim = clock[-1]
    finally:
        probe.close()
        process.stop()
    return (last_sim - first_sim) / (last_wall - first_wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window-s", type=float, default=6.0)
    args = parser.parse_args()
    twin = build_nominal_twin(Path(tempfile.mkdtemp()), "emulated")
    raw = raw_stepping(load_scene(twin), 20.0)
    replayed = replay_speed(twin, 20.0)
    print(f"raw MuJoCo stepping:   {raw:8.1f} sim s / wall s")
    print(f"replay (with sampling):{replayed:8.1f} sim s / wall s  -> ratio {replayed / raw:.2f} (goal >= 0.7)")
    for cameras in (False, True):
        print(f"sim bridge, as fast as possible, cameras {'on ' if cameras else 'off'}: "
              f"real-time factor {bridge_rtf(twin, cameras, args.window_s):.2f}")


if __name__ == "__main__":
    main()
