"""The push stage: box mass, box-table friction and finger friction from the windows where
the box moved, the arm held at its identified values. Pure Python.

With contacts the residual is chaotic in the parameters (a 0.2 % change of the box mass
moved the cost by up to 1.9x, in both directions), so a finite-difference Jacobian is noise
and Levenberg-Marquardt stalls in whichever dip is near. This stage minimizes the same sysid
residual with scipy's Nelder-Mead instead and takes its uncertainty from a quadratic
response surface of the cost sampled around the optimum: the scatter of the cost about that
trend is the objective's noise, and a parameter set is as good as the optimum while the
trend rises by less than it. Directions where the trend does not rise by that much over the
sampled region (typically mass against box friction when there are pushes but no lift: slow
pushes feel only the sliding force m*mu*g; a lifted box's weight is m*g) are reported as not
identifiable, with the product when it is.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable, Mapping

import numpy as np

from twinloop_builder.identification.data import FitData, column_weights, make_segment
from twinloop_builder.identification.fit import Stage
from twinloop_builder.identification.identifiability import stage_estimates
from twinloop_builder.identification.model import FitVariable, base_model, mimic_leaders
from twinloop_builder.identification.results import Estimate, StageFit, StageOutcome
from twinloop_builder.identification.settings import (BOX_PARAMETERS, DELAY, IdentificationCancelled,
                                                      IdentificationSettings, ProgressFn)
from twinloop_twin.scene import acting_command_delay

SLIDING_FORCE = "box.mass_kg*box.friction"


def identify_box(spec, prior: Mapping[str, float], values: Mapping[str, float], data: FitData,
                 variables: list[FitVariable], settings: IdentificationSettings, progress: ProgressFn,
                 cancelled: Callable[[], bool]) -> StageOutcome:
    """The push stage on data.pushes; `values` holds the arm's parameters (identified or prior)."""
    base = base_model(spec, contacts=True)
    # contact forces make efforts spiky (a millisecond of contact timing is a large effort
    # error); pushes are fitted on positions and the box pose, efforts weighted down
    weights = column_weights(dataclasses.replace(settings, effort_std_nm=settings.push_effort_std_nm), box=True)
    segments = [make_segment(base, r, a, b, weights) for r in data.pushes for a, b in data.push_windows[r.name]]
    fitted = {v.name for v in variables}
    fixed = {n: v for n, v in values.items() if n not in BOX_PARAMETERS}
    fixed[DELAY] = acting_command_delay(fixed[DELAY], base.opt.timestep)  # as the twin's scene will act
    fixed.update({n: prior[n] for n in BOX_PARAMETERS if n not in fitted})
    stage = Stage("box", spec, base, variables, fixed, segments, settings)
    fit = fit_contact_stage(stage, np.zeros(len(variables)), settings, progress, cancelled)
    out = stage_estimates(stage, fit, prior, settings, mimic=mimic_leaders(base))
    out.derived.update(sliding_force(stage, fit, settings, out.estimates, out.guidance))
    out.reports.append(fit.report)
    return out


def fit_contact_stage(stage: Stage, x0: np.ndarray, settings: IdentificationSettings, progress: ProgressFn,
                      cancelled: Callable[[], bool]) -> StageFit:
    """Nelder-Mead on the stage's cost, then a quadratic response surface around the optimum
    for the covariance (the module docstring says why)."""
    from scipy.optimize import minimize
    from scipy.stats import norm, qmc

    started = time.monotonic()
    low, high = (np.array(b) for b in zip(*(stage.bounds(v) for v in stage.variables)))
    n = len(x0)
    budget = settings.push_max_evaluations + settings.push_start_samples + settings.push_surface_samples + 2

    def cost(x: np.ndarray) -> float:
        if cancelled():
            raise IdentificationCancelled(f"cancelled during {stage.name}")
        r = stage.residual(np.clip(x, low, high))
        if stage.evaluations % 10 == 0:
            progress(stage.name, min(0.95, stage.evaluations / budget),
                     f"{stage.name}: {stage.evaluations} of ~{budget} evaluations")
        return float(r @ r)

    cost_before = cost(x0)
    progress(stage.name, 0.01, f"{stage.name}: fitting {n} parameters on {len(stage.segments)} push(es), "
                               f"cost {cost_before:.4g}")
    if settings.push_start_samples:
        # The cost is chaotic at small scales but its trend is broad: a few points spread
        # evenly (Sobol) over the whole search range find the trend's basin before the local
        # search (from a prior 2.5x off in box friction, Nelder-Mead from the prior alone
        # stopped at 100x the cost of the truth's basin, mass at its bound).
        unit = qmc.Sobol(n, seed=1).random(2 ** math.ceil(math.log2(settings.push_start_samples)))
        starts = low + (high - low) * unit[:settings.push_start_samples]
        start_costs = [cost(point) for point in starts]
        if min(start_costs) < cost_before:
            x0 = starts[int(np.argmin(start_costs))]
    simplex = np.clip(np.vstack([x0, x0 + 0.3 * np.eye(n)]), low, high)  # first moves of ~35 %
    found = minimize(cost, x0, method="Nelder-Mead", bounds=list(zip(low, high)),
                     options={"initial_simplex": simplex, "maxfev": settings.push_max_evaluations,
                              "xatol": 1e-3, "fatol": 1e-3 * cost_before})
    x_best, cost_best = np.asarray(found.x, dtype=float), float(found.fun)

    # Response surface: a full quadratic in the log-multipliers, least squares over samples
    # spread evenly (Sobol) in a box around the optimum.
    radius = settings.push_surface_radius
    samples = settings.push_surface_samples
    unit = qmc.Sobol(n, seed=0).random(2 ** math.ceil(math.log2(samples)))[:samples] * 2.0 - 1.0
    points = np.vstack([x_best, np.clip(x_best + radius * unit, low, high)])
    costs = np.array([cost_best] + [cost(point) for point in points[1:]])
    d = points - x_best
    pairs = list(itertools.combinations_with_replacement(range(n), 2))
    design = np.column_stack([np.ones(len(d)), d] + [d[:, i] * d[:, j] for i, j in pairs])
    coef, *_ = np.linalg.lstsq(design, costs, rcond=None)
    scatter = costs - design @ coef
    sigma_c = float(np.sqrt(scatter @ scatter / max(len(costs) - design.shape[1], 1)))
    gradient = coef[1:n + 1]
    hessian = np.zeros((n, n))
    for k, (i, j) in enumerate(pairs):
        hessian[i, j] = hessian[j, i] = coef[n + 1 + k] * (2.0 if i == j else 1.0)
    curvature, directions = np.linalg.eigh(hessian)
    # A direction is determined when the trend rises by more than the cost's own scatter
    # within the sampled region; along the others the data prefer nothing.
    determined = curvature * radius ** 2 / 2.0 > sigma_c
    x = x_best
    if determined.any():
        basis = directions[:, determined]
        step = np.clip(basis @ (-(basis.T @ gradient) / curvature[determined]), -radius, radius)
        candidate = np.clip(x_best + step, low, high)
        cost_candidate = cost(candidate)
        if cost_candidate <= cost_best + sigma_c:  # the trend's minimum, unless chaos disagrees there
            x = candidate
    span = float(np.max((high - low) / 2.0)) ** 2  # undetermined: anywhere in the search range
    variance = np.where(determined, 2.0 * sigma_c / np.where(determined, curvature, 1.0), span)
    sigma = directions @ np.diag(variance) @ directions.T
    half_width = norm.ppf(0.5 + settings.confidence / 2.0) * np.sqrt(np.diag(sigma))
    r = stage.residual(x)
    report = stage.report(iterations=int(found.nit), cost_before=cost_before, residual=r, inflation=1.0,
                          started=started)
    stage.close()
    return StageFit(x=x, covariance=sigma, half_width=half_width, report=report)


def sliding_force(stage: Stage, fit: StageFit, settings: IdentificationSettings, estimates: Mapping[str, Estimate],
                  guidance: list[str]) -> dict[str, Estimate]:
    """box.mass_kg * box.friction (the sliding force over g), which slow pushes determine even
    when they cannot tell the two apart."""
    from scipy.stats import norm

    names = [v.name for v in stage.variables]
    if "box.mass_kg" not in names or "box.friction" not in names:
        return {}
    e = np.zeros(len(names))
    e[[names.index("box.mass_kg"), names.index("box.friction")]] = 1.0
    std_log = float(np.sqrt(max(e @ fit.covariance @ e, 0.0)))
    mass, friction = estimates["box.mass_kg"], estimates["box.friction"]
    product = mass.mean * friction.mean
    half = norm.ppf(0.5 + settings.confidence / 2.0) * std_log
    identifiable = std_log <= settings.max_relative_std
    note = f"sliding force {product * 9.81:.3g} N"
    if identifiable and not (mass.identifiable and friction.identifiable):
        guidance.append(f"the pushes determine {SLIDING_FORCE} = {product:.4g} kg (±{std_log:.0%}; {note}) but not "
                        "box.mass_kg and box.friction each: add a lift of the box (config/excitation.yaml lifts; "
                        "its weight is its mass alone), or weigh the box and identify box.friction alone")
    return {SLIDING_FORCE: Estimate(SLIDING_FORCE, product, product * std_log, product * math.exp(-half),
                                    product * math.exp(half), mass.prior * friction.prior, identifiable, note)}
