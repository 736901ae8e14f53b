"""Train the carry policy in the twin: a privileged teacher, distilled into a deployable student.

Pure Python (numpy, MuJoCo, torch; no rclpy).

- **Contexts**: box starts (about the nominal place, `box_start.position_std_m`) and goals
  (along the goal direction, +- `goal.distance_variation_m`), drawn from the seed.
- **Teacher** (privileged: it scores actions by rolling the twin out, with the true box
  start, which a policy on the robot cannot): the cross-entropy method over (squeeze, carry
  duration), each candidate scored by its mean reward over draws of the variation's
  physics, box start and tracker noise (see `teacher`).
- **Student**: the exported module's MLP, fitted to the teacher's actions from the
  features a real cell gives it (the box's offset as the tracker reports it, with the
  tracker's noise; the goal). The decision is made once per episode from the first view of
  the box, before any action of the policy could change what it sees, so the states a
  student visits are the teacher's: plain distillation is what DAgger reduces to here.
- **Evaluation**: the student's success rate over fresh contexts and physics draws, with a
  95 % Wilson interval.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from twinloop_policy.carry import CarryPolicy
from twinloop_policy.rollouts import CarryRollouts, Episode
from twinloop_policy.task import EpisodeEnd, TaskConfig, reward, success
from twinloop_policy.variation import Variation
from twinloop_twin.statistics import wilson_interval


@dataclass(frozen=True)
class Context:
    box_xy: np.ndarray  # true start
    seen_box_offset: np.ndarray  # as the tracker reports it (true offset + noise)
    goal_xy: np.ndarray


@dataclass
class Evaluation:
    successes: int
    episodes: int
    interval: tuple[float, float]
    mean_squeeze_m: float
    mean_carry_s: float

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    def to_dict(self) -> dict:
        return {"success_rate": round(self.rate, 4), "successes": self.successes, "episodes": self.episodes,
                "interval_95": [round(v, 4) for v in self.interval], "mean_squeeze_m": round(self.mean_squeeze_m, 5),
                "mean_carry_s": round(self.mean_carry_s, 3)}


@dataclass
class TrainingResult:
    policy: CarryPolicy
    variation: Variation
    curve: list[dict] = field(default_factory=list)
    teacher_actions: np.ndarray | None = None  # (contexts, 2): squeeze m, carry s
    evaluation: Evaluation | None = None
    seconds: float = 0.0


def draw_contexts(task: TaskConfig, policy: CarryPolicy, count: int, rng: np.random.Generator) -> list[Context]:
    box0 = policy.box_xy.numpy()
    out = []
    for _ in range(count):
        box, seen = _box_and_view(task, box0, box0, rng)
        shift = rng.uniform(-task.goal.distance_variation_m, task.goal.distance_variation_m)
        goal = box0 + task.goal.direction * (task.goal.distance_m + shift)
        out.append(Context(box, seen, goal))
    return out


def _box_and_view(task: TaskConfig, about: np.ndarray, planned: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A box start drawn about `about`, and its offset from the planned place as the tracker reports it."""
    box = about + rng.normal(0.0, task.box_start.position_std_m, 2)
    return box, box - planned + rng.normal(0.0, task.observation.box_position_std_m, 2)


def _action(policy: CarryPolicy, unit: np.ndarray) -> tuple[float, float]:
    """(squeeze m, carry s) from a point of the unit square."""
    u = np.clip(unit, 0.0, 1.0)
    return (policy.squeeze_low + (policy.squeeze_high - policy.squeeze_low) * float(u[0]),
            policy.carry_low + (policy.carry_high - policy.carry_low) * float(u[1]))


def _unit(policy: CarryPolicy, action: Sequence[float]) -> np.ndarray:
    return np.array([(action[0] - policy.squeeze_low) / (policy.squeeze_high - policy.squeeze_low),
                     (action[1] - policy.carry_low) / (policy.carry_high - policy.carry_low)])


def teacher(task: TaskConfig, rollouts: CarryRollouts, variation: Variation, contexts: Sequence[Context],
            rng: np.random.Generator, progress: Callable[[str], None] = lambda _: None,
            curve: list[dict] | None = None) -> tuple[list[list[Context]], np.ndarray]:
    """The cross-entropy method over (squeeze, carry duration). Each context (a box start and
    a goal) gets `physics_per_candidate` draws of the variation's physics, with the box start
    and the tracker's noise drawn about the context's; a candidate's score is its mean reward
    over every draw of every context (the same draws for every candidate: common random
    numbers), so the action found holds across what the student cannot know.

    The action is shared by all contexts: how hard to grip and how fast to carry do not
    depend on where the box stands within the task's few centimetres (measured: the best
    action per context differs by less than CEM's own noise), and pooling the draws is what
    exposes the rare slip a few draws per context would miss. Returns each context's draws
    (what the student is fitted on) and the action per context (contexts, 2)."""
    t = task.training
    policy = rollouts.policy
    box0 = policy.box_xy.numpy()
    draws = []
    for c in contexts:
        ctx = []
        for _ in range(t.physics_per_candidate):
            box, seen = _box_and_view(task, c.box_xy, box0, rng)
            ctx.append((variation.sample(rng), Context(box, seen, c.goal_xy)))
        draws.append(ctx)
    flat = [d for ctx in draws for d in ctx]
    mean, std = np.full(2, 0.5), np.full(2, 0.3)
    best, best_score = mean.copy(), -np.inf
    for iteration in range(t.cem_iterations):
        start = time.perf_counter()
        units = np.clip(mean + std * rng.normal(size=(t.cem_population, 2)), 0.0, 1.0)
        episodes = [Episode(p, d.box_xy, d.seen_box_offset, d.goal_xy, *_action(policy, u))
                    for u in units for p, d in flat]
        ends = rollouts.run(episodes)
        rewards = np.array([reward(e, task) for e in ends]).reshape(t.cem_population, len(flat))
        wins = np.array([success(e, task) for e in ends]).reshape(t.cem_population, len(flat))
        scores = rewards.mean(axis=1)
        order = np.argsort(scores)[::-1]
        elite = units[order[:t.cem_elite]]
        mean, std = elite.mean(axis=0), np.maximum(elite.std(axis=0), 0.02)
        if scores[order[0]] > best_score:
            best_score, best = float(scores[order[0]]), units[order[0]].copy()
        seconds = time.perf_counter() - start
        squeeze, carry = _action(policy, best)
        progress(f"teacher iteration {iteration + 1}/{t.cem_iterations}: {len(episodes)} episodes, "
                 f"{wins.mean() * 100:.0f} % succeeded; best so far squeeze {squeeze * 1000:.1f} mm, carry "
                 f"{carry:.2f} s: {wins[order[0]].mean() * 100:.0f} % of {len(flat)} draws, mean reward "
                 f"{best_score:.3f} ({seconds:.1f} s)")
        if curve is not None:
            curve.append({"stage": "teacher", "iteration": iteration + 1, "episodes": len(episodes),
                          "success_rate": round(float(wins.mean()), 4),
                          "best_success_rate": round(float(wins[order[0]].mean()), 4),
                          "best_mean_reward": round(best_score, 4), "best_squeeze_m": round(squeeze, 5),
                          "best_carry_s": round(carry, 3), "seconds": round(seconds, 2)})
    return [[d for _, d in ctx] for ctx in draws], np.tile(_action(policy, best), (len(contexts), 1))


def distill(policy: CarryPolicy, contexts: Sequence[Context], actions: np.ndarray, *, epochs: int,
            seed: int = 0) -> float:
    """Fit the student to the teacher's actions from what the student sees; returns the final loss."""
    torch.manual_seed(seed)
    seen, goals = _student_inputs(policy, contexts)
    target = torch.tensor(np.array([_unit(policy, a) for a in actions]), dtype=torch.float64)
    # Start from the teacher's mean action (output layer: zero weights, bias at its logit)
    # and keep the weights small: from a handful of contexts the student should fall back
    # to that mean where it has not seen a context, not extrapolate.
    last = policy.student[-1]
    with torch.no_grad():
        mean = target.mean(dim=0).clamp(0.02, 0.98)
        last.weight.zero_()
        last.bias.copy_(torch.log(mean / (1.0 - mean)))
    weights = [p for n, p in policy.student.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in policy.student.named_parameters() if n.endswith("bias")]
    optimizer = torch.optim.Adam([{"params": weights, "weight_decay": 1e-2}, {"params": biases, "weight_decay": 0.0}],
                                 lr=1e-2)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        optimizer.zero_grad()
        predicted = torch.sigmoid(policy.student(policy.features(seen, goals)))
        loss = torch.mean((predicted - target) ** 2)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def _student_inputs(policy: CarryPolicy, contexts: Sequence[Context]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the student sees of each context: the tracker's box offset and the goal's offset."""
    seen = torch.tensor(np.array([c.seen_box_offset for c in contexts]), dtype=torch.float64)
    goals = torch.tensor(np.array([c.goal_xy for c in contexts]), dtype=torch.float64) - policy.planned_goal_xy
    return seen, goals


def student_actions(policy: CarryPolicy, contexts: Sequence[Context]) -> np.ndarray:
    seen, goals = _student_inputs(policy, contexts)
    with torch.no_grad():
        return policy.choose(seen, goals).numpy()


def evaluate(task: TaskConfig, rollouts: CarryRollouts, variation: Variation, episodes: int, seed: int,
             actions: Callable[[Sequence[Context]], np.ndarray] | None = None) -> Evaluation:
    """Success of the student (or of `actions`, a baseline) over fresh contexts and physics draws."""
    rng = np.random.default_rng(seed)
    contexts = draw_contexts(task, rollouts.policy, episodes, rng)
    physics = [variation.sample(rng) for _ in contexts]
    chosen = (actions or (lambda c: student_actions(rollouts.policy, c)))(contexts)
    ends: list[EpisodeEnd] = rollouts.run([Episode(p, c.box_xy, c.seen_box_offset, c.goal_xy, float(a[0]), float(a[1]))
                                           for c, p, a in zip(contexts, physics, chosen)])
    wins = sum(success(e, task) for e in ends)
    return Evaluation(wins, len(ends), wilson_interval(wins, len(ends)), float(np.mean(chosen[:, 0])),
                      float(np.mean(chosen[:, 1])))


def train(task: TaskConfig, rollouts: CarryRollouts, variation: Variation, *, seed: int | None = None,
          progress: Callable[[str], None] = lambda _: None) -> TrainingResult:
    """Teacher, distillation, evaluation in the variation's own physics."""
    start = time.perf_counter()
    seed = task.training.seed if seed is None else seed
    rng = np.random.default_rng(seed)
    result = TrainingResult(policy=rollouts.policy, variation=variation)
    contexts = draw_contexts(task, rollouts.policy, task.training.contexts, rng)
    seen, result.teacher_actions = teacher(task, rollouts, variation, contexts, rng, progress, result.curve)
    # every draw's view of the box, labelled with its context's action
    loss = distill(rollouts.policy, [d for ctx in seen for d in ctx],
                   np.repeat(result.teacher_actions, [len(ctx) for ctx in seen], axis=0),
                   epochs=task.training.student_epochs, seed=seed)
    result.curve.append({"stage": "student", "epochs": task.training.student_epochs, "loss": round(loss, 6)})
    progress(f"student fitted to {len(contexts)} teacher actions (loss {loss:.2e}); evaluating "
             f"{task.training.evaluation_episodes} episodes")
    result.evaluation = evaluate(task, rollouts, variation, task.training.evaluation_episodes, seed + 1)
    result.curve.append({"stage": "evaluation", **result.evaluation.to_dict()})
    low, high = result.evaluation.interval
    progress(f"student succeeds {result.evaluation.rate * 100:.0f} % in the {variation.mode} twin "
             f"(95 % interval {low * 100:.0f}-{high * 100:.0f} %, {result.evaluation.episodes} episodes)")
    result.seconds = time.perf_counter() - start
    return result
