"""identify(): the stages in order, data -> arm -> push -> held-out. Pure Python."""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import mujoco

from twinloop_builder.identification.arm import arm_variables, identify_arm
from twinloop_builder.identification.data import FitData, check_recordings, sort_fit_data
from twinloop_builder.identification.held_out import score_held_out
from twinloop_builder.identification.model import FitVariable, mimic_leaders
from twinloop_builder.identification.push import identify_box
from twinloop_builder.identification.results import IdentificationResult, StageOutcome, unidentified
from twinloop_builder.identification.settings import (BOX_PARAMETERS, DELAY, IdentificationError,
                                                      IdentificationSettings, ProgressFn)
from twinloop_builder.recording import RecordedMotion


def planned_stages(fit: Sequence[RecordedMotion], held_out: Sequence[RecordedMotion] = (), *,
                   settings: IdentificationSettings = IdentificationSettings(),
                   select: Sequence[str] = ()) -> tuple[str, ...]:
    """The stages identify() and the build will run on these recordings, in order (for
    progress: a stage may still be passed over, e.g. when no arm joint moved)."""
    return _stage_plan(sort_fit_data(fit, settings), bool(held_out), select, settings.residual)


def _stage_plan(data: FitData, held_out: bool, select: Sequence[str], residual: str = "off") -> tuple[str, ...]:
    def chosen(prefix: str) -> bool:  # any parameter under `prefix` selected
        return not select or any(s.startswith(prefix) or prefix.startswith(s) for s in select)

    stages = ["reading"]
    if data.arm and chosen(DELAY):
        stages.append("arm_delay")
    if data.arm and (chosen("joint.") or chosen("actuator.")):
        stages.append("arm")
    if data.pushes and any(chosen(name) for name in BOX_PARAMETERS):
        stages.append("box")
    if held_out:
        stages.append("held_out")
    if residual_planned(data, select, residual):
        stages.append("residual")
    return (*stages, "writing", "done")


def residual_planned(data: FitData, select: Sequence[str], residual: str) -> bool:
    """The residual stage runs after a whole-arm identification (no `select`) with recordings
    of the arm alone, unless the settings turn it off."""
    return residual != "off" and bool(data.arm) and not select


def identify(spec: mujoco.MjSpec, prior: Mapping[str, float], fit: Sequence[RecordedMotion], *,
             held_out: Sequence[RecordedMotion] = (), settings: IdentificationSettings = IdentificationSettings(),
             select: Sequence[str] = (), progress: ProgressFn = lambda *_: None,
             plan: Callable[[tuple[str, ...]], None] = lambda stages: None,
             cancelled: Callable[[], bool] = lambda: False) -> IdentificationResult:
    """Identify the physics of `spec` (the parent twin's scene) from fit recordings.

    `prior`: the parent twin's parameter means (every name of twinloop_twin.nominal's
    physics_parameters). `select`: name prefixes to identify (empty: everything the data
    can identify); the rest keep the prior. `plan(stages)` is told once, before the first
    stage, which stages the recordings call for (planned_stages).
    """
    check_recordings(fit, held_out, settings)
    data = sort_fit_data(fit, settings)
    plan(_stage_plan(data, bool(held_out), select, settings.residual))

    def chosen(name: str) -> bool:
        return not select or any(name.startswith(s) for s in select)

    found = StageOutcome()
    values = dict(prior)
    scene = spec.compile()
    if data.arm:
        variables, never_moved = arm_variables(scene, prior, data, settings, chosen)
        found.add(never_moved)
        if variables:
            found.add(identify_arm(spec, prior, values, data, variables, settings, progress, cancelled))
            values.update(found.fitted_values())
    elif not data.pushes:
        raise IdentificationError("no usable fit recording")
    else:
        found.guidance.append("no joint excitation among the fit recordings: joint dynamics, gains and the delay "
                              "keep their prior; record `twinloop build excite --kind joints`")

    box_variables = [FitVariable(n, (n,), (prior[n],)) for n in BOX_PARAMETERS if chosen(n)]
    if data.pushes and box_variables:
        found.add(identify_box(spec, prior, values, data, box_variables, settings, progress, cancelled))
    elif box_variables:
        for name in BOX_PARAMETERS:
            if name not in found.estimates:
                found.estimates[name] = unidentified(name, prior[name], "no push of the box in the fit data; record "
                                                     "`twinloop build excite --kind pushes`")
        found.guidance.append("no push in the fit data: box mass and friction keep their prior")

    mimic = mimic_leaders(scene)
    for name in prior:
        if name not in found.estimates:
            joint = name.split(".")[1] if name.startswith("actuator.") else ""
            note = ("not selected for identification" if not chosen(name) else
                    f"{joint} mimics {mimic[joint]}: it has no actuator" if joint in mimic else "not identified")
            found.estimates[name] = unidentified(name, prior[name], note)
    result = IdentificationResult(found.estimates, found.reports, found.guidance, found.correlations,
                                  derived=found.derived)
    if held_out:
        progress("held_out", 0.0, f"predicting {len(held_out)} held-out recording(s)")
        # what the new version will hold: a parameter the data did not pin down keeps its prior
        written = {n: e.mean if e.identifiable else prior[n] for n, e in result.estimates.items()}
        result.set_held_out(score_held_out(spec, prior, written, held_out, settings))
    return result
