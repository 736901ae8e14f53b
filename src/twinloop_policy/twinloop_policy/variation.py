"""Physical variation for training: from the twin's measured uncertainty, not invented worlds.

Pure Python (numpy). Four modes, side by side:

- `nominal`: the twin's means, no randomization (trained on twin v0 this is the nominal model);
- `posterior`: ours. Each parameter the twin identified ~ Normal(mean, std), truncated to
  positive values; each it did not identify uniform over its prior range (mean +-
  prior_range_sigma std, floored at prior_floor_fraction of the mean). A twin that has
  identified nothing, or carries no uncertainty, is refused: its "posterior" would be a guess;
- `wide`: hand-set broad ranges (config/policy_task.yaml variation.wide), uniform, the
  rest at the twin's means - the usual domain randomization;
- `oracle`: the emulated cell's true physics file. Measurement only: a real cell has no
  such file, and every policy trained with it says so.

A sample is a mapping of parameter names (twinloop_twin.nominal.physics_parameters) to
values, applied to a compiled model with twinloop_twin.model_parameters.apply_parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twinloop_policy.task import TaskConfig
from twinloop_twin.nominal import physics_parameters
from twinloop_twin.parameters import ParameterSet
from twinloop_twin.physics import WorkcellPhysics

MODES = ("nominal", "posterior", "wide", "oracle")
ORACLE_LABEL = "oracle: the emulated cell's true physics (measurement only; no real cell offers it)"


class VariationError(ValueError):
    """The variation cannot be built from what was given; the message says what to do."""


@dataclass(frozen=True)
class Variation:
    mode: str
    means: dict[str, float]
    normal: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, std), truncated > 0
    uniform: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (low, high)
    gain_factor: tuple[float, float] | None = None  # wide: x every actuator kp and kv
    label: str = ""

    def sample(self, rng: np.random.Generator) -> dict[str, float]:
        """One physics draw; the parameters in the order of `means`."""
        out = dict(self.means)
        for name in self.means:  # a fixed order: a draw depends on the seed only
            if name in self.normal:
                mean, std = self.normal[name]
                value = rng.normal(mean, std)
                for _ in range(100):
                    if value > 0:
                        break
                    value = rng.normal(mean, std)
                out[name] = float(max(value, 1e-6 * abs(mean)))
            elif name in self.uniform:
                out[name] = float(rng.uniform(*self.uniform[name]))
        if self.gain_factor is not None:
            for name in self.means:
                if name.startswith("actuator."):
                    out[name] = self.means[name] * float(rng.uniform(*self.gain_factor))
        return out

    def describe(self) -> dict[str, Any]:
        """What policy.yaml records under `randomization`."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.label:
            out["label"] = self.label
        if self.normal:
            out["normal_mean_std"] = {k: [round(m, 6), round(s, 6)] for k, (m, s) in self.normal.items()}
        if self.uniform:
            out["uniform_low_high"] = {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in self.uniform.items()}
        if self.gain_factor is not None:
            out["actuator_gain_factor"] = list(self.gain_factor)
        if self.mode in ("nominal", "oracle"):
            out["values"] = {k: round(v, 6) for k, v in self.means.items()}
        return out


def make_variation(mode: str, task: TaskConfig, parameters: ParameterSet | None = None,
                   oracle: WorkcellPhysics | None = None) -> Variation:
    """The variation of `mode` from the twin's `parameters` (nominal, posterior, wide) or
    the emulated cell's true physics `oracle`."""
    if mode not in MODES:
        raise VariationError(f"unknown variation mode {mode!r}; modes: {list(MODES)}")
    if mode == "oracle":
        if oracle is None:
            raise VariationError("mode oracle needs the emulated cell's truth file (--oracle-physics); "
                                 "a real cell has none")
        return Variation(mode, physics_parameters(oracle, source="oracle").means(), label=ORACLE_LABEL)
    if parameters is None:
        raise VariationError(f"mode {mode} needs a twin's parameters")
    means = parameters.means()
    if mode == "nominal":
        return Variation(mode, means)
    if mode == "wide":
        ranges = dict(task.variation.wide)
        factor = ranges.pop("joint_gain_factor")
        missing = sorted(set(ranges) - set(means))
        if missing:
            raise VariationError(f"the twin has no parameters {missing} that variation.wide ranges")
        return Variation(mode, means, uniform=ranges, gain_factor=factor)
    identified = [name for name, p in parameters.items() if p.identifiable]
    if not identified:
        raise VariationError("this twin has identified no parameter (its stds are its priors): identify the "
                             "physics first (`twinloop build`), or train with --mode wide")
    no_std = [name for name in identified if parameters[name].std <= 0.0]
    if no_std:
        raise VariationError(f"parameters {no_std[:3]}{' ...' if len(no_std) > 3 else ''} are marked identified "
                             "but have std 0: a posterior needs each one's uncertainty; rebuild the twin with "
                             "identification, or train with --mode nominal")
    normal, uniform = {}, {}
    k, floor = task.variation.prior_range_sigma, task.variation.prior_floor_fraction
    for name, p in parameters.items():
        if p.identifiable:
            normal[name] = (p.mean, p.std)
        elif p.std > 0:
            uniform[name] = (max(p.mean - k * p.std, floor * p.mean), p.mean + k * p.std)
    return Variation(mode, means, normal=normal, uniform=uniform)

