"""Build a new twin version from identification recordings. Pure Python (no rclpy).

parent twin (scene, parameters) + fit bags -> identify -> (residual) -> new version with the
identified scene, every parameter as mean ± std with its identifiable flag, an identification
report, a learned residual where identification left a systematic error
(twinloop_builder.residual_fit), and provenance (which bags, which split, which parent).
Held-out bags only score the result.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import mujoco
import numpy as np
import yaml

from twinloop_twin.bundle import (Provenance, SourceBag, TwinBundle, TwinError, load_twin_version,
                                  write_twin_version)
from twinloop_twin.nominal import SCENE_FILE, load_twin_workcell, scene_files, twin_geometry
from twinloop_twin.parameters import Parameter, ParameterSet
from twinloop_twin.physics import WorkcellPhysics, load_physics, physics_from_dict, physics_to_dict
from twinloop_twin.residual import HAND_BODY, RESIDUAL_FILE, ResidualWeights
from twinloop_twin.scene import TIMESTEP_S, acting_command_delay, add_hand_load, build_workcell_spec

from twinloop_builder.identification import (IdentificationCancelled, IdentificationError,
                                             IdentificationResult, IdentificationSettings, identify)
from twinloop_builder.identification.data import sort_fit_data
from twinloop_builder.identification.pipeline import residual_planned
from twinloop_builder.recording import RecordingError, load_recording
from twinloop_builder.residual_fit import (ResidualOutcome, carrying_load, fit_residual, load_changed,
                                          load_difference, with_the_load)

REPORT_FILE = "identification/report.yaml"


@dataclass(frozen=True)
class BuildResult:
    twin: TwinBundle
    result: IdentificationResult
    residual: ResidualOutcome | None = None  # None: the residual stage did not run


def physics_with(raw: dict, values: dict[str, float]) -> dict:
    """The physics YAML layout (physics_to_dict) with named parameter values written in."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    raw["joints"] = {j: dict(p) for j, p in raw["joints"].items()}
    for name, value in values.items():
        parts = name.split(".")
        if parts[0] == "joint":
            raw["joints"][parts[1]][parts[2]] = value
        elif parts[0] == "actuator":
            raw["joints"][parts[1]][parts[2]] = value
        elif name == "command.delay_s":
            # the scene's delay acts in whole physics steps (zero-order hold): the step the
            # value acts as (identification reports a step's middle; round() would pick the
            # step below for every odd one)
            raw["command_delay_ms"] = acting_command_delay(value, TIMESTEP_S) * 1000.0
        elif name == "box.mass_kg":
            raw["box"]["mass_kg"] = value
        elif name == "box.friction":
            raw["box"]["friction"] = value
        elif name == "finger.friction":
            raw["finger_friction"] = value
    return raw


def identified_parameters(parent: ParameterSet, result: IdentificationResult,
                          select: Sequence[str] = ()) -> ParameterSet:
    """Identified parameters as mean ± std; the rest keep the parent's value, flagged, with
    the reason. With `select` (name prefixes), a parameter outside it was not asked about:
    it stays exactly as the parent had it (identified there or not)."""
    items = {}
    for name, parameter in parent.items():
        estimate = result.estimates.get(name)
        if select and not any(name.startswith(s) for s in select):
            items[name] = parameter
        elif estimate is not None and estimate.identifiable:
            items[name] = Parameter(mean=estimate.mean, std=estimate.std, identifiable=True, unit=parameter.unit,
                                    source="identified",
                                    note=f"{_confidence_note(estimate)}; prior {parameter.mean:.6g} ± {parameter.std:.3g}")
        else:
            note = estimate.note if estimate is not None and estimate.note else "not identified"
            items[name] = Parameter(mean=parameter.mean, std=parameter.std, identifiable=False, unit=parameter.unit,
                                    source=parameter.source, note=note)
    return ParameterSet(items)


def _confidence_note(estimate) -> str:
    return f"95 % interval [{estimate.ci_low:.6g}, {estimate.ci_high:.6g}]"


def report_dict(result: IdentificationResult, bags: list[SourceBag]) -> dict:
    return {
        "estimates": {n: {"mean": e.mean, "std": None if math.isnan(e.std) else e.std,
                          "ci_low": None if math.isnan(e.ci_low) else e.ci_low,
                          "ci_high": None if math.isnan(e.ci_high) else e.ci_high,
                          "prior": e.prior, "identifiable": e.identifiable, "note": e.note}
                      for n, e in result.estimates.items()},
        "derived": {n: {"mean": e.mean, "std": e.std, "ci_low": e.ci_low, "ci_high": e.ci_high,
                        "identifiable": e.identifiable, "note": e.note} for n, e in result.derived.items()},
        "not_identifiable": result.not_identifiable,
        "guidance": list(result.guidance),
        "correlations_above_0_8": [{"a": a, "b": b, "correlation": c} for (a, b), c in result.correlations.items()],
        "held_out": {"joint_rmse_before_rad": _finite(result.held_out_rmse_before_rad),
                     "joint_rmse_after_rad": _finite(result.held_out_rmse_after_rad),
                     "per_joint_rad": {j: {"before": b, "after": a} for j, (b, a) in result.held_out_per_joint.items()},
                     **_held_out_extra(result.held_out)},
        "stages": [{"name": s.name, "parameters": s.parameters, "recordings": s.recordings, "iterations": s.iterations,
                    "residual_evaluations": s.residual_evaluations, "cost_before": s.cost_before,
                    "cost_after": s.cost_after, "autocorrelation_inflation": s.autocorrelation_inflation,
                    "residual_rms_noise_units": s.residual_rms,
                    "wall_s": s.wall_s} for s in result.stages],
        "source_bags": [{"path": b.path, "sha256": b.sha256, "split": b.split, "purpose": b.purpose} for b in bags],
    }


def _held_out_extra(score) -> dict:
    if score is None:
        return {}
    return {"joint_effort_rmse_before_nm": _finite(score.effort_rmse_before_nm),
            "joint_effort_rmse_after_nm": _finite(score.effort_rmse_after_nm),
            "box_rmse_before_m": _finite(score.box_rmse_before_m), "box_rmse_after_m": _finite(score.box_rmse_after_m)}


def _finite(value: float):
    return None if math.isnan(value) else value


@dataclass(frozen=True)
class Identified:
    """Identification from bags, before anything is written: the parent, what was found,
    the recordings it used."""

    parent: TwinBundle
    result: IdentificationResult
    fit: list
    held_out: list
    select: tuple[str, ...] = ()
    # the load on the hand the identification's model had (mass kg, offset m in the hand's
    # frame): the parent's residual's, which the next version carries on; None: none
    load: tuple[float, np.ndarray] | None = None
    # the parent's load checked against the recordings (the report's `load_check`): its mass,
    # the mass the recordings show beyond it, whether it was kept; empty where the parent has none
    load_check: dict = dataclasses.field(default_factory=dict)


def held_out_lineage(root: Path | str, workcell: str, version: int) -> dict[str, str]:
    """sha256 -> path of every held-out bag in the provenance of `version` and its ancestors."""
    held: dict[str, str] = {}
    seen: set[int] = set()
    current: int | None = version
    while current is not None and current not in seen:
        seen.add(current)
        try:
            twin = load_twin_version(root, workcell, current)
        except TwinError:  # an ancestor removed by hand: what the others held out still counts
            break
        held.update({b.sha256: b.path for b in twin.manifest.provenance.source_bags if b.split == "held_out"})
        current = twin.manifest.provenance.parent_version
    return held


def identify_from_bags(root: Path | str, workcell: str, fit_bags: Sequence[str], held_out_bags: Sequence[str] = (),
                       *, parent_version: int | None = None, select: Sequence[str] = (),
                       settings: IdentificationSettings = IdentificationSettings(),
                       progress: Callable[[str, float, str], None] = lambda *_: None,
                       plan: Callable[[tuple[str, ...]], None] = lambda stages: None,
                       cancelled: Callable[[], bool] = lambda: False) -> Identified:
    """Read and check the bags, identify on top of the parent; nothing is written.

    A fit bag must be split 'fit' in its session metadata, and none may be a bag that any
    version of the lineage held out (by content hash): held-out data never fits a twin.
    """
    parent = load_twin_version(root, workcell, parent_version)
    if not fit_bags:
        raise RecordingError("no fit bag given: record an identification session with split 'fit' "
                             "(twinloop build excite --split fit) and pass it")
    overlap = set(map(str, fit_bags)) & set(map(str, held_out_bags))
    if overlap:
        raise RecordingError(f"bags {sorted(overlap)} are given as both fit and held-out data; they never mix")
    progress("reading", 0.0, f"reading {len(fit_bags)} fit and {len(held_out_bags)} held-out bag(s)")
    fit = [load_recording(p, expected_split="fit", min_duration_s=settings.min_duration_s,
                          box_source=settings.box_source) for p in fit_bags]
    lineage = held_out_lineage(root, workcell, parent.version)
    for recording in fit:
        if recording.sha256 in lineage:
            raise RecordingError(f"fit bag {recording.path} has the content of {lineage[recording.sha256]}, which "
                                 f"{workcell} v{parent.version}'s lineage held out: held-out data never fits a twin; "
                                 "record new fit data")
    held_out = [load_recording(p, expected_split="held_out", min_duration_s=1.0, box_source=settings.box_source)
                for p in held_out_bags]
    spec = mujoco.MjSpec.from_file(str(parent.file_path(SCENE_FILE)))
    load = parent_load(parent)
    if load is not None:  # the parent's parameters were identified with it: so are these
        progress("reading", 0.0, f"v{parent.version} carries a load on the hand ({load[0]:.3f} kg at "
                                 f"{np.round(load[1], 3).tolist()} m): identifying with it")
        add_hand_load(spec, load[0], load[1], radius_m=0.0)
    result = identify(spec, parent.parameters.means(), fit, held_out=held_out, settings=settings, select=select,
                      progress=progress, plan=plan, cancelled=cancelled)
    identified = Identified(parent, result, fit, held_out, tuple(select), load)
    return identified if load is None else _check_the_load(identified, settings, progress, cancelled)


def _check_the_load(identified: Identified, settings: IdentificationSettings,
                    progress: Callable[[str, float, str], None], cancelled: Callable[[], bool]) -> Identified:
    """The parent's load on the hand against these recordings: the mass their torque labels
    show beyond it on the arm identified with it (residual_fit.load_difference). A load that
    is no longer on the cell as it was (taken off at maintenance, another tool) would stay in
    every later version otherwise: the arm is identified again without it, and the residual
    stage looks for a load from scratch. Needs a recording of the arm alone; without one the
    load is kept unchecked, and the report says so."""
    mass, offset = identified.load
    parent = identified.parent
    arm = sort_fit_data(identified.fit, settings).arm
    if not arm:
        progress("held_out", 1.0, f"v{parent.version}'s load on the hand not checked: no fit recording moves the arm "
                                 "alone")
        return dataclasses.replace(identified, load_check={"parent_mass_kg": round(mass, 4), "checked": False,
                                                           "kept": True})
    parameters = identified_parameters(parent.parameters, identified.result, identified.select)
    difference = load_difference(_identified_spec(parent, parameters, identified.load).compile(), arm)
    check = {"parent_mass_kg": round(mass, 4), "checked": True, "difference_kg": round(difference, 4)}
    if not load_changed(mass, difference):
        progress("held_out", 1.0, f"v{parent.version}'s load on the hand ({mass:.3f} kg) matches these recordings "
                                 f"({difference:+.3f} kg beyond it)")
        return dataclasses.replace(identified, load_check={**check, "kept": True})
    progress("held_out", 1.0, f"v{parent.version}'s load on the hand ({mass:.3f} kg) does not match these recordings "
                             f"(they show {difference:+.3f} kg beyond it): the cell's load changed; identifying again "
                             "without it")
    # from the parent's parameters, as the first identification: the ones identified with the
    # load have absorbed its absence into the arm's dynamics
    result = identify(mujoco.MjSpec.from_file(str(parent.file_path(SCENE_FILE))), parent.parameters.means(),
                      identified.fit, held_out=identified.held_out, settings=settings, select=identified.select,
                      cancelled=cancelled,
                      progress=lambda stage, fraction, message: progress(stage, fraction, f"without the load: {message}"))
    return dataclasses.replace(identified, result=result, load=None, load_check={**check, "kept": False})


def parent_load(parent: TwinBundle) -> tuple[float, np.ndarray] | None:
    """The load on the hand a version's residual carries (mass kg, offset m), None if none."""
    path = parent.path / RESIDUAL_FILE
    if not path.is_file():
        return None
    weights = ResidualWeights.load(path)
    return (weights.payload_mass_kg, weights.payload_offset_m.copy()) if weights.payload_mass_kg > 0.0 else None


def write_identified_version(root: Path | str, identified: Identified, *, parameters: ParameterSet | None = None,
                             created_by: str = "identification", note: str = "",
                             extra_files: dict[str, bytes] | None = None,
                             residual: ResidualOutcome | None = None,
                             progress: Callable[[str, float, str], None] = lambda *_: None) -> TwinBundle:
    """Write the next version from an identification (`parameters`: the identified ones as
    adjusted by the caller, e.g. a correction's widened intervals; default as identified;
    `residual`: the residual stage's outcome, its network written when it kept one)."""
    parent, result = identified.parent, identified.result
    workcell = parent.workcell
    progress("writing", 0.97, "writing the new twin version")
    if parameters is None:
        parameters = identified_parameters(parent.parameters, result, identified.select)
    raw, physics = _identified_physics(parent, parameters)
    twin_workcell = load_twin_workcell(parent)
    files = scene_files(twin_workcell, physics, twin_geometry(parent))  # the parent's measured geometry stays
    files["inputs/physics.yaml"] = ("# Identified by twinloop_builder from the bags in twin.yaml provenance.\n"
                                    + yaml.safe_dump(raw, sort_keys=False)).encode()
    files["inputs/workcell.yaml"] = parent.file_path("inputs/workcell.yaml")
    files["inputs/workcell_description.urdf"] = parent.file_path("inputs/workcell_description.urdf")
    bags = [SourceBag(path=r.path, sha256=r.sha256, split=r.split, purpose=r.purpose)
            for r in identified.fit + identified.held_out]
    report = report_dict(result, bags)
    if identified.load_check:
        report["load_check"] = identified.load_check
    if residual is not None:
        report["residual"] = residual.report()
        if residual.weights is not None:
            files[RESIDUAL_FILE] = residual.weights.to_bytes()
    files[REPORT_FILE] = yaml.safe_dump(report, sort_keys=False).encode()
    files.update(extra_files or {})
    provenance = Provenance(
        created_by=created_by, parent_version=parent.version, source_bags=bags,
        calibration=parent.manifest.provenance.calibration,
        note=note or (f"physics identified with mujoco.sysid from {len(identified.fit)} fit bag(s); held-out joint "
                      f"RMSE {result.held_out_rmse_before_rad:.3g} -> {result.held_out_rmse_after_rad:.3g} rad; "
                      f"not identifiable: {len(result.not_identifiable)} parameter(s), see {REPORT_FILE}"
                      + (f"; learned residual {residual.reason}" if residual is not None and residual.weights is not None
                         else "")))
    # the calibration the parent carried still holds: identification does not touch it
    twin = write_twin_version(root, workcell, parameters=parameters, provenance=provenance, files=files,
                              calibration=dict(parent.manifest.calibration or {}) or None)
    progress("done", 1.0, f"wrote {workcell} v{twin.version}")
    return twin


def _identified_spec(parent: TwinBundle, parameters: ParameterSet,
                     load: tuple[float, Sequence[float]] | None) -> mujoco.MjSpec:
    """The parent's scene (its description and measured geometry) with `parameters`, and a
    load on the hand where one is given (mass, offset in the hand's frame)."""
    _, physics = _identified_physics(parent, parameters)
    spec = build_workcell_spec(load_twin_workcell(parent), physics, geometry=twin_geometry(parent))
    if load is not None:
        add_hand_load(spec, load[0], load[1], radius_m=0.0)
    return spec


def _identified_physics(parent: TwinBundle, parameters: ParameterSet) -> tuple[dict, WorkcellPhysics]:
    parent_physics = load_physics(parent.file_path("inputs/physics.yaml"))
    raw = physics_with(physics_to_dict(parent_physics), parameters.means())
    return raw, physics_from_dict(raw, source="identified")


def fit_identified_residual(identified: Identified, settings: IdentificationSettings,
                            progress: Callable[[str, float, str], None] = lambda *_: None, *,
                            parameters: ParameterSet | None = None,
                            load: tuple[float, Sequence[float]] | None = None,
                            stop_at_load: bool = False, find_load: bool = True) -> ResidualOutcome | None:
    """The residual stage on the identified twin (None where it does not run: settings off,
    a selective identification, no recording of the arm alone).

    `parameters`: the new version's own where they are not the identification's (a
    correction's, widened ones included); the residual is then learned against them after a
    selective identification too, since what it compensates is the whole version's error.
    `load`: a load on the hand (mass, offset in the hand's frame) the identification had in
    its model: the networks learn what is left beside it (default: the identification's own,
    the parent's, which the outcome carries on even where no network is kept or the stage
    does not run). `stop_at_load`: return as soon as the stage finds a load (fit_residual);
    `find_load` False: no load is looked for."""
    inherited = load is None and identified.load is not None
    load = identified.load if load is None else load
    data = sort_fit_data(identified.fit, settings)
    parent = identified.parent
    if not residual_planned(data, () if parameters is not None else identified.select, settings.residual):
        if (parent.path / RESIDUAL_FILE).is_file():
            # what the parent's networks compensated was its parameters' error, not these
            progress("residual", 1.0, f"v{parent.version}'s learned residual networks are not carried on (they "
                                      "compensated its parameters' error; the stage learns them again after a "
                                      "whole-arm identification with recordings of the arm alone, not after --select "
                                      "or with --residual off)")
        if not inherited:
            return None
        return dataclasses.replace(
            carrying_load(ResidualOutcome(None, ""), load, _hand_mass(parent),
                          f"the parent's load on the hand carried on ({load[0]:.3f} kg), no network learned"),
            load_note={"from_parent": True})
    if parameters is None:
        parameters = identified_parameters(parent.parameters, identified.result, identified.select)
    outcome = fit_residual(_identified_spec(parent, parameters, load).compile(), data.arm, identified.held_out, mode=settings.residual,
                           find_load=find_load and load is None, stop_at_load=stop_at_load,
                           progress=lambda fraction, message: progress("residual", fraction, message))
    if inherited:
        outcome = dataclasses.replace(
            carrying_load(outcome, load, _hand_mass(parent),
                          f"{outcome.reason}; the parent's load on the hand ({load[0]:.3f} kg) carried on"),
            load_note={"from_parent": True})
    progress("residual", 1.0, f"residual: {outcome.reason}")  # whichever way it ended
    return outcome


def build_identified_twin(root: Path | str, workcell: str, fit_bags: Sequence[str], held_out_bags: Sequence[str] = (),
                          *, parent_version: int | None = None, select: Sequence[str] = (),
                          settings: IdentificationSettings = IdentificationSettings(),
                          progress: Callable[[str, float, str], None] = lambda *_: None,
                          plan: Callable[[tuple[str, ...]], None] = lambda stages: None,
                          cancelled: Callable[[], bool] = lambda: False) -> BuildResult:
    """Identify from the fit bags on top of `parent_version` (None: latest) and write the next version.

    `progress(stage, fraction of that stage, message)` as the stages go; `plan(stages)` once
    the bags are read, with the stages that will run (twinloop_builder.progress weighs them).

    Raises RecordingError (bad bags, a bag the lineage held out given as fit),
    IdentificationError (data that cannot identify anything), IdentificationCancelled, or
    twinloop_twin.bundle.TwinError; nothing is written unless everything succeeded.
    """
    identified = identify_from_bags(root, workcell, fit_bags, held_out_bags, parent_version=parent_version,
                                    select=select, settings=settings, progress=progress, plan=plan,
                                    cancelled=cancelled)
    residual = fit_identified_residual(identified, settings, progress, stop_at_load=identified.load is None)
    if residual is not None and residual.load is not None and identified.load is None:
        identified, residual = _again_with_the_load(identified, residual, settings, progress, cancelled)
    return BuildResult(write_identified_version(root, identified, residual=residual, progress=progress),
                       identified.result, residual)


def _again_with_the_load(identified: Identified, first: ResidualOutcome, settings: IdentificationSettings,
                         progress: Callable[[str, float, str], None],
                         cancelled: Callable[[], bool]) -> tuple[Identified, ResidualOutcome]:
    """The residual stage found a load on the hand the description lacks: the arm's
    parameters had taken some of it up (its inertia into armature and gains), so the arm is
    identified again with the load in the model, and the networks learn what is left. The
    load is kept (residual_fit.with_the_load) where that arm predicts the validation part
    MIN_IMPROVEMENT better; the version's residual then carries it (twinloop_twin.residual:
    its inertia on the hand, its weight) beside the networks or alone. Else the networks
    alone on the first identification."""
    mass, offset = first.load
    parent = identified.parent
    progress("residual", 0.5, f"a load on the hand: {mass:.3f} kg at {np.round(offset, 3).tolist()} m (the hand's "
                              "frame); identifying the arm again with it")
    spec = mujoco.MjSpec.from_file(str(parent.file_path(SCENE_FILE)))
    add_hand_load(spec, mass, offset, radius_m=0.0)
    start = identified_parameters(parent.parameters, identified.result, identified.select).means()
    result = identify(spec, start, identified.fit, held_out=identified.held_out, settings=settings,
                      select=identified.select, cancelled=cancelled,
                      progress=lambda stage, fraction, message: progress("residual", 0.5, f"with the load: {message}"))
    again = Identified(parent, result, identified.fit, identified.held_out, identified.select,
                       (mass, np.asarray(offset, dtype=float)))
    second = fit_identified_residual(again, settings, progress, load=(mass, offset))
    note = {"arm_identified_again_with_it": True,
            "held_out_rmse_mrad_without_it": _mrad(identified.result.held_out_rmse_after_rad),
            "held_out_rmse_mrad_with_it": _mrad(result.held_out_rmse_after_rad)}
    reason = (f"a load on the hand the description lacks, {mass:.3f} kg at {np.round(offset, 3).tolist()} m (the "
              f"hand's frame); the arm identified again with it (held-out {note['held_out_rmse_mrad_without_it']} -> "
              f"{note['held_out_rmse_mrad_with_it']} mrad); beside it: {second.reason if second else 'nothing'}")
    kept = with_the_load(first, second, _hand_mass(parent), reason)
    if kept is None:
        # the load did not make the arm's own prediction better: not a load; the networks alone
        progress("residual", 0.5, "the arm identified with the load predicts the validation part no better: the "
                                  "networks alone on the first identification")
        return identified, fit_identified_residual(identified, settings, progress, find_load=False)
    progress("residual", 1.0, f"residual: {reason}")
    return again, dataclasses.replace(kept, load_note=note)


def _hand_mass(parent: TwinBundle) -> float:
    model = mujoco.MjModel.from_xml_path(str(parent.file_path(SCENE_FILE)))
    return float(model.body_mass[model.body(HAND_BODY).id])


def _mrad(value: float) -> float | None:
    return round(value * 1e3, 4) if math.isfinite(value) else None


__all__ = ["BuildResult", "IdentificationCancelled", "IdentificationError", "Identified", "RecordingError",
           "REPORT_FILE", "build_identified_twin", "fit_identified_residual", "held_out_lineage", "identified_parameters", "identify_from_bags", "parent_load",
           "physics_with", "write_identified_version"]
