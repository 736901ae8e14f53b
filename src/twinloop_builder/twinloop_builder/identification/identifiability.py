"""Uncertainty and identifiability: a fitted stage as per-parameter estimates with intervals,
the identifiable flag and, where a parameter is not identifiable, what to record instead.
Pure Python."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from twinloop_builder.identification.fit import Stage
from twinloop_builder.identification.results import Estimate, StageFit, StageOutcome
from twinloop_builder.identification.settings import DELAY_UNIT_S, IdentificationSettings


def guidance_for(name: str) -> str:
    """What excitation determines the named parameter."""
    quantity = name.split(".")[-1]
    joint = name.split(".")[1] if name.count(".") == 2 else ""
    hints = {
        "friction_loss": f"slow motion with many velocity reversals of {joint}",
        "damping": f"motion of {joint} over a wider range of speeds",
        "armature": f"faster (higher-frequency) motion of {joint}, for larger accelerations",
        "kp": f"larger tracking errors of {joint} (faster or loaded motion)",
        "kv": f"faster motion of {joint}",
        "delay_s": "sharper command changes (higher excitation band)",
        "mass_kg": "a lift of the box (config/excitation.yaml lifts: the held box loads the arm with its mass "
                   "alone), or a longer hold",
        "friction": ("pushes and a lift together (pushes feel mass x friction, the lift the mass)"
                     if name == "box.friction" else "off-centre pushes, so the box slides along the fingers"),
    }
    return hints.get(quantity, "more varied excitation")


def stage_estimates(stage: Stage, fit: StageFit, prior: Mapping[str, float], settings: IdentificationSettings, *,
                    mimic: Mapping[str, str], only: Sequence[str] | None = None) -> StageOutcome:
    """Estimates of the stage's parameters (those in `only`, if given) from its fit.

    `mimic`: {follower joint: leader joint}. Each joint of a pair has its own friction,
    damping and armature in the fit, but none is flagged identifiable: the recordings tell
    mostly the pair's sum. (Seen on a drawn truth: finger 1's friction loss at its search
    bound with no sensitivity left, finger 2's at 0.80 +- 0.065 N for a true 1.22.) The
    leader's gains are judged as usual.
    """
    out = StageOutcome()
    x, sigma, half = fit.x, fit.covariance, fit.half_width
    rms = fit.report.residual_rms
    # A model that leaves residuals far above the sensor noise does not explain the data
    # (e.g. a workcell that lagged, commands that arrived late): no number from it is confident.
    inadequate = rms > settings.max_residual_rms
    if inadequate:
        out.guidance.append(f"stage {stage.name}: residuals {rms:.1f}x the sensor noise; its parameters are not "
                            "trusted. Record again with steady command timing (check the workcell's lag_skips and load)")
    std_x = np.sqrt(np.clip(np.diag(sigma), 0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = sigma / np.outer(std_x, std_x)
    names = [v.name for v in stage.variables]
    paired = set(mimic) | set(mimic.values())
    for i, variable in enumerate(stage.variables):
        if only is not None and variable.name not in only:
            continue
        low, high = stage.bounds(variable)
        at_bound = min(x[i] - low, high - x[i]) < 1e-3 * (high - low)
        others = [(abs(corr[i, k]), names[k]) for k in range(len(names)) if k != i and np.isfinite(corr[i, k])]
        worst = max(others) if others else (0.0, "")
        for k in range(len(names)):
            if k != i and np.isfinite(corr[i, k]) and abs(corr[i, k]) > 0.8:
                out.correlations[tuple(sorted((names[i], names[k])))] = float(corr[i, k])
        for target, mean in variable.physical(float(x[i])).items():
            if variable.is_delay:
                std = std_x[i] * DELAY_UNIT_S
                lo, hi = (x[i] - half[i]) * DELAY_UNIT_S, (x[i] + half[i]) * DELAY_UNIT_S
            else:
                # log-parametrized: the std of the value is value * std of the log (delta method)
                std = mean * std_x[i]
                # a direction the data hardly constrain has a huge (or NaN) half-width: no bound
                width = float(half[i])
                lo, hi = (mean * math.exp(-width), mean * math.exp(width)) if width < 50.0 else (0.0, math.inf)
            relative = std / abs(mean) if mean else float("inf")
            identifiable = bool(np.isfinite(std) and relative <= settings.max_relative_std and not at_bound
                                and not inadequate)
            note = ""
            if target.startswith("joint.") and target.split(".")[1] in paired:
                identifiable = False
                follower = next(f for f, leader in mimic.items() if target.split(".")[1] in (f, leader))
                note = (f"{follower} follows {mimic[follower]} through a soft equality: each joint's friction, "
                        "damping and armature are fit on their own, but the recordings tell mostly their sum")
            elif inadequate:
                note = (f"not identifiable: the model leaves residuals {rms:.1f}x the sensor noise (> "
                        f"{settings.max_residual_rms:g}x), so it does not explain this recording; record again "
                        "with steady command timing (an unloaded workcell host)")
            elif not identifiable:
                why = (f"at its search bound ({mean:.4g})" if at_bound else
                       f"relative std {relative:.0%} > {settings.max_relative_std:.0%}")
                confound = f"; confounded with {worst[1]} (correlation {worst[0]:.2f})" if worst[0] > 0.8 else ""
                note = f"not identifiable from this data: {why}{confound}; add {guidance_for(target)}"
                out.guidance.append(f"{target}: {note}")
            if not np.isfinite(std):
                std = abs(prior[target])
            out.estimates[target] = Estimate(target, float(mean), float(std), float(lo), float(hi), prior[target],
                                             identifiable, note)
    return out
