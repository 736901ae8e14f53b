"""Sim bridge: serves a twin version over exactly the hardware contract, on a simulated
clock (/clock, for nodes with use_sim_time), in real time or as fast as possible.

Optionally draws the twin's physical parameters from its posterior (mean ± std of every
parameter in twin.yaml) at every reset, from a seeded generator, so that an episode's
physics are reproducible.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from visualization_msgs.msg import MarkerArray

from twinloop_ros.messages import scene_markers
from twinloop_ros.node import StartupError, make_executor, run_node
from twinloop_ros.qos import LATCHED
from twinloop_sim.workcell_server_node import ServedModel, WorkcellServer
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.bundle import TwinError, load_twin
from twinloop_twin.model_parameters import apply_parameters, sample_parameters
from twinloop_twin.nominal import load_scene, load_twin_workcell
from twinloop_twin.residual import load_residual
from twinloop_twin.scene import SCENE_BODIES

PARAMETERS = {
    "twin_path": ("", "twin version folder (twins/<workcell>/v<N>) to serve"),
    "real_time": (True, "pace the simulation to the wall clock; false: as fast as possible"),
    "sample_posterior": (False, "draw the twin's physical parameters from its posterior at every reset"),
}



class SimBridge(WorkcellServer):
    def __init__(self) -> None:
        super().__init__("sim_bridge", PARAMETERS, simulated_clock=True)
        # The twin's scene for RViz (latched); the box marker follows the simulation.
        self.scene_pub = self.create_publisher(MarkerArray, "/twinloop/twin/scene_markers", LATCHED)
        self.create_timer(0.2, self.publish_scene)

    def publish_scene(self) -> None:
        self.scene_pub.publish(scene_markers(self.sim.model, self.sim.data, SCENE_BODIES, self._stamp()))

    def load_model(self, p: dict) -> ServedModel:
        if not p["twin_path"]:
            raise StartupError("parameter twin_path is empty: give a twin version folder, "
                               "e.g. twins/emulated/v0 (build v0 with `make demo` or twinloop_twin.nominal)")
        try:
            self.twin = load_twin(Path(p["twin_path"]))
            workcell = load_twin_workcell(self.twin)
            model = load_scene(self.twin)
            residual = load_residual(self.twin, model)  # a bad residual file (TwinError) is refused at start-up
        except (TwinError, FileNotFoundError, ValueError) as error:
            raise StartupError(f"cannot serve twin '{p['twin_path']}': {error}") from error
        self._rng = np.random.default_rng(p["seed"])
        sim = WorkcellSimulation(workcell, model=model, seed=p["seed"], residual=residual)
        return ServedModel(
            sim=sim, urdf_xml=workcell.urdf_xml,
            camera_parameters={"twin_path": str(self.twin.path)},
            description=f"twin {self.twin.workcell} v{self.twin.version} ({self.twin.path})"
                        + (", physics drawn from the posterior per episode" if p["sample_posterior"] else ""))

    def before_reset(self) -> None:
        if self.p["sample_posterior"]:
            draw = sample_parameters(self.twin.parameters, self._rng)
            apply_parameters(self.sim.model, draw)
            self.get_logger().info(f"episode physics drawn from the posterior ({len(draw)} parameters)")


def main(args=None) -> None:
    run_node(SimBridge, args, executor=make_executor())


if __name__ == "__main__":
    main()
