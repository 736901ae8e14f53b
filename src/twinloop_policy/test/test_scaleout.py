"""Rollouts and training as tasks on a local Ray instance with 2 workers give what they give
here: the same episodes end the same way, and the same seed trains the same policy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from twinloop_policy.carry import CarryPolicy, plan_carry
from twinloop_policy.rollouts import CarryRollouts, Episode
from twinloop_policy.scaleout import RayRollouts
from twinloop_policy.task import load_task_config
from twinloop_policy.training import draw_contexts, train
from twinloop_policy.variation import make_variation
from twinloop_twin.nominal import physics_parameters
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import compile_workcell
from twinloop_twin.workcell import default_config_dir


@pytest.fixture(scope="module")
def both(workcell):
    shipped = load_task_config()
    task = dataclasses.replace(shipped, training=dataclasses.replace(
        shipped.training, contexts=2, physics_per_candidate=3, cem_population=4, cem_iterations=1,
        evaluation_episodes=8))
    model = compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))
    plan = plan_carry(task, workcell, model)

    def local() -> CarryRollouts:
        return CarryRollouts(model, CarryPolicy(plan, task), task, workcell.box.link, plan.box_z_m, workers=2)

    remote = RayRollouts(local(), "local", workers=2)
    yield task, local, remote
    remote.close()


def test_the_same_episodes_end_the_same_way_on_ray(both):
    task, local, remote = both
    here = local()
    values = physics_parameters(load_physics(default_config_dir() / "emulated_truth.yaml"), source="t").means()
    contexts = draw_contexts(task, here.policy, 6, np.random.default_rng(4))
    episodes = [Episode(values, c.box_xy, c.seen_box_offset, c.goal_xy, squeeze, 0.8)
                for c, squeeze in zip(contexts, (0.008, 0.012, 0.016, 0.02, 0.024, 0.028))]
    assert remote.cpus == 2
    for a, b in zip(here.run(episodes), remote.run(episodes)):
        assert np.array_equal(a.box_xy, b.box_xy) and a.grip_force_n == b.grip_force_n, (a, b)
    assert remote.steps_taken == here.steps_taken


def test_the_same_seed_trains_the_same_policy_on_ray(both):
    task, local, remote = both
    variation = make_variation("wide", task, physics_parameters(load_physics(default_config_dir() /
                                                                             "nominal_physics.yaml"), source="n"))
    here = train(task, local(), variation)
    there = train(task, remote, variation)
    assert np.array_equal(here.teacher_actions, there.teacher_actions)
    assert here.evaluation.to_dict() == there.evaluation.to_dict()
    print(f"local and Ray: teacher action {here.teacher_actions[0].round(4).tolist()}, student "
          f"{here.evaluation.rate:.0%} of {here.evaluation.episodes} in the wide twin both ways")
