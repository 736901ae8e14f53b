"""Emulated workcell: a stand-in for hardware behind the hardware contract.

MuJoCo runs the workcell in real time on hidden "true" physics (`truth_file`) that differ
from the nominal model, with sensor noise, on the wall clock, and the node exposes exactly
what a real workcell exposes: /joint_states (>= 500 Hz), /joint_command (position targets
through the delayed actuator model), /tf, /tf_static, latched /robot_description, and both
RGB-D cameras (rendered by a child process, see emulated_cameras_node). It is the sim
bridge's server serving a truth model plus noise; other nodes cannot tell it from a robot.
"""
from __future__ import annotations

from twinloop_ros.node import make_executor, run_node
from twinloop_sim.inputs_node import load_sim_inputs
from twinloop_sim.workcell_server_node import ServedModel, WorkcellServer
from twinloop_sim.unmodelled import effects_text
from twinloop_sim.workcell_sim import WorkcellSimulation

PARAMETERS = {
    "truth_file": ("", "physics YAML with the hidden true parameters; empty: config/emulated_truth.yaml"),
    "workcell_config": ("", "workcell YAML; empty: config/workcell.yaml"),
    "urdf": ("", "workcell URDF; empty: urdf/workcell.urdf"),
}


class EmulatedWorkcell(WorkcellServer):
    def __init__(self) -> None:
        super().__init__("emulated_workcell", PARAMETERS, simulated_clock=False)

    def load_model(self, p: dict) -> ServedModel:
        inputs = load_sim_inputs(p["truth_file"], p["workcell_config"], p["urdf"])
        self.inputs = inputs
        return ServedModel(
            sim=WorkcellSimulation(inputs.workcell, inputs.physics, seed=p["seed"]),
            urdf_xml=inputs.workcell.urdf_xml,
            camera_parameters={"truth_file": str(inputs.physics_path),
                               "workcell_config": str(inputs.workcell.config_path),
                               "urdf": str(inputs.workcell.urdf_path)},
            description=f"truth '{inputs.physics_path}', command delay "
                        f"{inputs.physics.command_delay_s * 1e3:.1f} ms"
                        + (f", unmodelled effects: {effects_text(inputs.physics.unmodelled)}"
                           if inputs.physics.unmodelled is not None else ""))


def main(args=None) -> None:
    run_node(EmulatedWorkcell, args, executor=make_executor())


if __name__ == "__main__":
    main()
