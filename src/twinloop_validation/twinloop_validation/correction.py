"""Correction: the next twin version from the mismatch a validation round measured. Pure Python.

    validated twin vN + its rounds' report.json + new fit recordings  ->  vN+1

1. **What the mismatch implicates** (`implicate`), from the rounds' numbers alone:
   - the box's outcome: trials where the twin's box ends otherwise than the tracker saw it
     (a different success, or its end further from the tracker's than the goal radius)
     implicate the parameters that decide where a handled box goes: the grip (pad
     friction, the gripper's gain), the box's mass and its friction on the table;
   - the arm's motion: trials whose staleness z exceeds the threshold on a joint (its
     replay error beyond what the twin's uncertainty predicts) implicate that joint's
     dynamics and gain, and the command delay; in a trial that handled the box (it moved
     or was carried) also the box's and the grip's parameters, because the contact loads
     the arm (measured: a twin whose only error is a box friction x2.5 replays a push
     15.7 mrad off on panda_joint6, z 14, the right twin 0.34 mrad, z 0.3);
   - a round that judged the twin stale (median z above the threshold: the cell changed, as
     after maintenance) implicates the whole arm: the joints its trials hardly moved are
     as suspect as those they did (seen: a twin of another drawn physics, with only its
     three worst joints re-identified, left residuals far above the sensor noise on an
     excitation of every joint, and identification trusted none of them).
2. **Re-identification** of exactly those parameters (twinloop_builder's identification with
   `select`), on the parent's fit recordings (from its provenance, where still on disk
   with the same content) and the new ones; the held-out recordings (the parent's, and the
   rounds' trial bags) only score the result. After a round that judged the twin stale
   the parent's own recordings (fit and held-out) are of the cell as it was before it
   changed: they are left out, the new fit recordings alone fit the version and the
   rounds' trials alone score it (`select_recordings`). No held-out bag ever fits: the builder
   refuses a fit bag whose session says held_out or whose content any version of the
   lineage held out (asserted here again on the written version's provenance).
3. **Widening**: an implicated parameter that the data still cannot pin down keeps the
   parent's mean with its std multiplied by `widen` (default 2): the twin's uncertainty
   must now cover what it failed to predict, and training in the posterior sees it.
4. The version's provenance says why (created_by `correction`, the parent, the rounds,
   each implicated parameter with its evidence); `correction/report.yaml` in the version
   holds every number (parent vs new values, the held-out errors before and after).
5. A parent that carries a learned residual (twinloop_twin.residual) gets a version whose
   residual is learned again against the corrected parameters, on every fit recording
   (twinloop_builder.build.fit_identified_residual): the parent's compensated the parent's
   parameters' error, not the new ones'. Where no systematic error is left, none is kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml

from twinloop_twin.physics import ARM_JOINTS, COMMANDED_JOINTS

from twinloop_validation.scoring import STALE_Z, ValidationError

# the grip: pad friction and the gain of each commanded gripper joint; the box it holds
GRIP = ("finger.friction", *(f"actuator.{j}.kp" for j in COMMANDED_JOINTS if j not in ARM_JOINTS),
        "box.mass_kg", "box.friction")
ARM_QUANTITIES = ("joint.{j}.damping", "joint.{j}.friction_loss", "joint.{j}.armature", "actuator.{j}.kp",
                  "actuator.{j}.kv")
DELAY = "command.delay_s"
HANDLED = ("success", "slip", "overshoot", "off_target")  # failure modes in which the box moved
WIDEN = 2.0
CORRECTION_REPORT = "correction/report.yaml"
NOTE_REASONS = 4  # reasons written into the provenance note (all of them are in CORRECTION_REPORT)


@dataclass
class Implication:
    """Parameter name -> the evidence that implicates it, in words."""

    reasons: dict[str, list[str]] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)  # policies whose round judged the twin stale: the cell changed

    def add(self, names: Sequence[str], reason: str) -> None:
        for name in names:
            self.reasons.setdefault(name, [])
            if reason not in self.reasons[name]:
                self.reasons[name].append(reason)

    @property
    def names(self) -> list[str]:
        return list(self.reasons)


def implicate(reports: Sequence[dict], parameter_names: Sequence[str], stale_z: float = STALE_Z) -> Implication:
    """What the rounds' mismatch implicates (the module docstring gives the rules)."""
    known = set(parameter_names)
    found = Implication()
    for report in reports:
        policy, radius = report.get("policy", "?"), float(report["goal_radius_m"])
        trials = report["trials"]
        wrong = [t for t in trials if t["real_success"] != t["twin_success"] or t["box_end_error_m"] > radius]
        if wrong:
            errors = np.array([t["box_end_error_m"] for t in wrong])
            modes = ", ".join(sorted({t["failure_mode"] for t in wrong}))
            found.add([n for n in GRIP if n in known],
                      f"{policy}: the twin's box ended otherwise than the tracker saw it in {len(wrong)} of "
                      f"{len(trials)} trials (real: {modes}; box end error median {np.median(errors) * 100:.1f} cm, "
                      f"goal radius {radius * 100:.1f} cm)")
        staleness = report.get("summary", {}).get("staleness", {})
        if staleness.get("stale"):
            found.stale.append(policy)
            found.add([n for n in parameter_names if n == DELAY or (n.split(".")[0] in ("joint", "actuator")
                                                                   and n.split(".")[1] in ARM_JOINTS)],
                      f"{policy}: the round judged the twin stale (median z {staleness['median_z']:.1f} above "
                      f"{staleness['threshold']:g}): the cell changed")
        for trial in trials:
            spread = trial.get("predicted_spread_rad") or {}
            handled = trial["failure_mode"] in HANDLED
            for joint, predicted in spread.items():
                z = trial["joint_rmse_rad"][joint] / predicted
                if z > stale_z:
                    names = [q.format(j=joint) for q in ARM_QUANTITIES] + [DELAY] + (list(GRIP) if handled else [])
                    found.add([n for n in names if n in known],
                              f"{policy}: {joint} replayed {trial['joint_rmse_rad'][joint] * 1e3:.1f} mrad off in "
                              f"{Path(trial['bag']).name}, z {z:.1f} above {stale_z:g}"
                              + (" (the box was handled: its contact loads the arm)" if handled else ""))
    return found


def select_recordings(parent, reports: Sequence[dict], fit_bags: Sequence[str], *, changed: bool,
                      parent_fit: bool = True, say: Callable[[str], None] = lambda _: None) -> tuple[list[str], list[str]]:
    """(fit bags, held-out bags) of a correction of `parent` (a loaded twin version).

    Fit: the new `fit_bags`, and the parent's own fit bags still on disk with the content it
    was fit on. Held out: the parent's held-out bags on disk and the rounds' trial bags. Where
    the cell `changed` (a round judged the parent stale) the parent's recordings are of the
    cell before the change: only the new fit bags fit and only the rounds' trials score.
    Raises ValidationError when no fit bag is left."""
    from twinloop_builder.recording import bag_sha256

    label = f"{parent.workcell}/v{parent.version}"
    fit = [str(b) for b in fit_bags]
    own = parent.manifest.provenance.source_bags
    if changed and any(b.split in ("fit", "held_out") for b in own):
        say(f"the rounds judged {label} stale (the cell changed): its own {len(own)} recording(s), made before the "
            "change, are left out; the new fit bags alone fit the next version, the rounds' trials score it")
    if parent_fit and not changed:
        for bag in own:
            path = Path(bag.path)
            if bag.split != "fit":
                continue
            if not path.exists() or bag_sha256(path) != bag.sha256:
                say(f"the parent's fit bag {path} is gone or changed: left out")
                continue
            if str(path) not in fit:
                fit.append(str(path))
    if not fit:
        if changed:
            raise ValidationError(f"no fit recording of the changed cell: {label}'s own recordings are from before "
                                  "the change; record new fit data on the cell as it is now (e.g. `twinloop build "
                                  "excite --kind joints --split fit`) and give it with --fit")
        raise ValidationError(f"no fit recording: {label} names none on disk and none was given; record new fit "
                              "data (e.g. `twinloop trials run POLICY --split fit`, `twinloop build excite --split fit`)")
    held_out = list(dict.fromkeys(
        ([] if changed else [str(b.path) for b in own if b.split == "held_out" and Path(b.path).exists()])
        + [t["bag"] for r in reports for t in r["trials"] if Path(t["bag"]).exists()]))
    return fit, [b for b in held_out if b not in fit]


@dataclass(frozen=True)
class CorrectionResult:
    twin_path: Path
    version: int
    implicated: dict[str, list[str]]
    reidentified: list[str]
    widened: list[str]
    report: dict


def correct_twin(twin_path: Path | str, reports: Sequence[dict], fit_bags: Sequence[str], *, widen: float = WIDEN,
                 stale_z: float = STALE_Z, parent_fit: bool = True, settings=None,
                 progress: Callable[[str, float, str], None] = lambda *_: None,
                 say: Callable[[str], None] = lambda _: None) -> CorrectionResult | None:
    """Write the next version of the twin at `twin_path` from the rounds scored against it;
    None when the rounds implicate nothing (the twin agreed with the cell).

    Raises ValidationError (rounds of another twin, no fit data) and the builder's
    RecordingError / IdentificationError (bad or held-out fit bags, data that identify nothing).
    """
    from twinloop_builder.build import (REPORT_FILE, fit_identified_residual, held_out_lineage, identified_parameters,
                                        identify_from_bags, write_identified_version)
    from twinloop_builder.identification import IdentificationSettings
    from twinloop_twin.bundle import load_twin
    from twinloop_twin.parameters import Parameter, ParameterSet
    from twinloop_twin.residual import RESIDUAL_FILE

    if not widen >= 1.0 or not math.isfinite(widen):
        raise ValidationError(f"widen {widen}: give a factor of at least 1")
    parent = load_twin(twin_path)
    label = f"{parent.workcell}/v{parent.version}"
    if not reports:
        raise ValidationError("no validation round given: correction starts from a round scored against the twin "
                              "(`twinloop validate run|score`)")
    others = sorted({r.get("twin", "?") for r in reports} - {label})
    if others:
        raise ValidationError(f"rounds scored against {others}, not {label}: a correction starts from rounds of "
                              "the twin it corrects (score the bags again with `twinloop validate score --twin`)")
    implication = implicate(reports, list(parent.parameters), stale_z)
    if not implication.names:
        say(f"the rounds implicate no parameter: {label} predicted every trial's box outcome and motion within its "
            "uncertainty; nothing to correct")
        return None
    say(f"implicated: {', '.join(implication.names)}")
    root = parent.path.parent.parent
    fit, held_out = select_recordings(parent, reports, fit_bags, changed=bool(implication.stale),
                                      parent_fit=parent_fit, say=say)
    progress("reading", 0.0, f"re-identifying {len(implication.names)} parameter(s) from {len(fit)} fit bag(s); "
                             f"{len(held_out)} held-out bag(s) score it")
    identified = identify_from_bags(root, parent.workcell, fit, held_out, parent_version=parent.version,
                                    select=implication.names, settings=settings or IdentificationSettings(),
                                    progress=progress)
    new = identified_parameters(parent.parameters, identified.result, implication.names)
    parameters = {n: new[n] for n in new}
    reidentified, widened = [], []
    for name in implication.names:
        estimate = identified.result.estimates.get(name)
        before = parent.parameters[name]
        if estimate is not None and estimate.identifiable:
            reidentified.append(name)
            continue
        widened.append(name)
        parameters[name] = Parameter(mean=before.mean, std=before.std * widen, identifiable=before.identifiable,
                                     unit=before.unit, source=before.source,
                                     note=f"widened x{widen:g} by correction of v{parent.version} (the data do not "
                                          f"pin it down): {implication.reasons[name][0]}")
    held = identified.result.held_out
    body = {
        "parent": label,
        "rounds": [{"policy": r.get("policy"), "twin": r.get("twin"), "trials": r["summary"]["trials"],
                    "real_successes": r["summary"]["real_successes"], "twin_successes": r["summary"]["twin_successes"]}
                   for r in reports],
        "implicated": implication.reasons, "reidentified": reidentified, "widened": widened, "widen_factor": widen,
        "parameters": {n: {"parent": _pair(parent.parameters[n]), "new": _pair(parameters[n])}
                       for n in implication.names},
        "fit_bags": fit, "held_out_bags": held_out, "cell_changed": bool(implication.stale),
        "held_out": None if held is None else {
            "joint_rmse_rad": [held.rmse_before_rad, held.rmse_after_rad],
            "joint_effort_rmse_nm": [held.effort_rmse_before_nm, held.effort_rmse_after_nm],
            "box_rmse_m": [held.box_rmse_before_m, held.box_rmse_after_m]},
        "identification_report": REPORT_FILE,
    }
    reasons = sorted({r for found in implication.reasons.values() for r in found})
    note = (f"correction of v{parent.version} from {len(reports)} validation round(s): re-identified "
            f"{', '.join(reidentified) or 'nothing'}; widened x{widen:g} {', '.join(widened) or 'nothing'}; why: "
            + "; ".join(reasons[:NOTE_REASONS])
            + (f"; and {len(reasons) - NOTE_REASONS} more" if len(reasons) > NOTE_REASONS else "")
            + ("; the cell changed: fit on the new recordings only, not the parent's" if implication.stale else "")
            + f"; see {CORRECTION_REPORT}")
    residual = None
    if (parent.path / RESIDUAL_FILE).is_file():
        # The parent's residual compensated the parent's parameters' error; against the new
        # ones it is learned again (kept, or dropped where no systematic error is left).
        say(f"{label} carries a learned residual: learning it again against the corrected parameters")
        residual = fit_identified_residual(identified, settings or IdentificationSettings(), progress,
                                           parameters=ParameterSet(parameters))
        body["residual"] = residual.report() if residual is not None else None
        if residual is None:
            say("no residual learned (the builder's residual setting is off, or no fit recording moves the arm "
                "alone): the corrected version has none")
    twin = write_identified_version(
        root, identified, parameters=ParameterSet(parameters), created_by="correction", note=note,
        extra_files={CORRECTION_REPORT: yaml.safe_dump(_plain(body), sort_keys=False).encode()},
        residual=residual, progress=progress)
    fitted = {b.sha256 for b in twin.manifest.provenance.source_bags if b.split == "fit"}
    if fitted & set(held_out_lineage(root, twin.workcell, twin.version)):  # the builder refuses it before this
        raise RuntimeError(f"{twin.path}: a held-out bag is among its fit bags; do not use this version")
    return CorrectionResult(twin.path, twin.version, implication.reasons, reidentified, widened, body)


def _pair(parameter) -> dict:
    return {"mean": parameter.mean, "std": parameter.std, "identifiable": parameter.identifiable}


def _plain(value):
    """numpy scalars and NaN as YAML-safe numbers (NaN as null)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def format_correction(result: CorrectionResult) -> str:
    lines = [f"wrote {result.twin_path} (v{result.version})"]
    for name, values in result.report["parameters"].items():
        old, new = values["parent"], values["new"]
        how = "re-identified" if name in result.reidentified else "widened"
        lines.append(f"  {name}: {old['mean']:.4g} ± {old['std']:.3g} -> {new['mean']:.4g} ± {new['std']:.3g} ({how})")
    held = result.report["held_out"]
    if held:
        (jb, ja), (eb, ea), (bb, ba) = held["joint_rmse_rad"], held["joint_effort_rmse_nm"], held["box_rmse_m"]
        lines.append(f"  held-out: joint RMSE {jb * 1e3:.2f} -> {ja * 1e3:.2f} mrad; effort RMSE {eb:.3f} -> "
                     f"{ea:.3f} N m" + (f"; box RMSE {bb * 100:.2f} -> {ba * 100:.2f} cm"
                                         if bb is not None and math.isfinite(bb) else ""))
    residual = result.report.get("residual")
    if residual is not None:  # the parent carried one: learned again against the new parameters
        held_rmse = residual["held_out_rmse_mrad"]
        lines.append(f"  learned residual: {residual['reason']}"
                     + (f"; held-out {held_rmse['without']} -> {held_rmse['with']} mrad"
                        if held_rmse["with"] is not None else ""))
    return "\n".join(lines)
