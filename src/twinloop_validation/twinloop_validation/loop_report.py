"""One page per loop iteration: a run folder's artefacts read back, as report.json (every
number) and report.html (plotly, plotly.js embedded: it opens with no network).

    twinloop validate report RUN_DIR      # writes RUN_DIR/report.json and RUN_DIR/report.html

What it reads, and nothing else (no number is recomputed from a model):
- the calibration files under calibration/<workcell>/ (`twinloop calibrate`): camera,
  setup, 1-sigma uncertainty, reprojection and held-out residuals, views used, and how far
  the calibrated pose lies from the camera's mount in the workcell description;
- the twin versions under twins/<workcell>/: provenance (what made each, its parent, why),
  every parameter as mean ± std with its identifiable flag, the measured geometry a version
  carries (table top, the box's start pose, objects the description lacks: its
  inputs/geometry.yaml), each version's standing (twinloop_twin.status);
- the validation rounds under validation/*/report.json: real and predicted success with
  their 95 % intervals, failure modes, envelope interventions, staleness; per twin version
  the sim-vs-real agreement over the policies (Pearson r, MMRV: twinloop_twin.statistics);
- the bags under bags/: split and purpose from their session metadata, message counts per
  topic from the bag's index, the recorder's drop estimates where it wrote them.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

from twinloop_validation.scoring import ValidationError, compare_rounds

KEY_TOPICS = ("/joint_states", "/joint_command", "/twinloop/perception/box_pose", "/twinloop/envelope/status")


def _finite(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def collect(run_dir: Path, workcell: str = "emulated") -> dict:
    """The run's numbers, read from its artefacts."""
    from twinloop_logging.bag_reader import BagError, open_bag
    from twinloop_twin.bundle import list_versions, load_twin_version
    from twinloop_twin.nominal import twin_geometry
    from twinloop_twin.status import load_verdicts

    root = run_dir / "twins"
    versions = list_versions(root, workcell)
    if not versions:
        raise ValidationError(f"{run_dir} holds no twin of workcell '{workcell}' (twins/{workcell}/v<N>): give the "
                              "folder of a `twinloop loop` run")
    verdicts = load_verdicts(root, workcell)
    twins = []
    for version in versions:
        twin = load_twin_version(root, workcell, version)
        provenance = twin.manifest.provenance
        verdict = verdicts.get(version)
        layer = twin_geometry(twin)
        twins.append({
            "version": version, "created_by": provenance.created_by, "parent": provenance.parent_version,
            "created_at": provenance.created_at, "note": provenance.note or "",
            "source_bags": [{"path": b.path, "split": b.split, "purpose": b.purpose} for b in provenance.source_bags],
            "standing": None if verdict is None else {"state": verdict.state, "evidence": verdict.evidence,
                                                      "round": verdict.round},
            "geometry": None if layer is None else {
                "table_top_height_m": layer.table_top_height_m, "box_position_m": list(layer.box_position_m),
                "box_quat_wxyz": list(layer.box_quat_wxyz), "objects": [o.name for o in layer.objects]},
            "parameters": {n: {"mean": p.mean, "std": p.std, "identifiable": p.identifiable, "unit": p.unit}
                           for n, p in twin.parameters.items()}})
    rounds, reports = [], []
    for path in sorted((run_dir / "validation").glob("*/report.json")):
        report = json.loads(path.read_text())
        s = report["summary"]
        rounds.append({"folder": path.parent.name, "policy": report["policy"], "twin": report["twin"],
                       **{k: s[k] for k in ("trials", "real_successes", "real_rate", "real_interval",
                                            "twin_successes", "twin_rate", "twin_interval", "agreement",
                                            "failure_modes", "envelope_rejected", "envelope_faults")},
                       # (rounds scored before the posterior rate was: none)
                       "twin_posterior_rate": _finite(float(s.get("twin_posterior_rate", math.nan))),
                       "staleness": s["staleness"]})
        reports.append(report)
    agreement = {}
    for twin_label in sorted({r["twin"] for r in rounds}):
        of_twin = [r for r in reports if r["twin"] == twin_label]
        if len({r["policy"] for r in of_twin}) == len(of_twin) >= 2:
            result = compare_rounds(of_twin)  # the posterior rates where every round has them
            agreement[twin_label] = {"policies": result.policies, "basis": result.basis,
                                     "pearson_r": _finite(float(result.pearson_r)), "mmrv": float(result.mmrv)}
    bags = []
    for path in sorted(p for p in (run_dir / "bags").iterdir()) if (run_dir / "bags").is_dir() else []:
        try:
            with open_bag(path) as bag:
                session = bag.session
                stats = bag.topic_stats
                bags.append({"name": path.name, "split": session.split if session else "",
                             "purpose": session.purpose if session else "",
                             "messages": {t: bag.topics[t].count for t in KEY_TOPICS if t in bag.topics},
                             "dropped_estimate": {t: v.get("dropped_estimate") for t, v in stats.items()
                                                  if isinstance(v, dict) and v.get("dropped_estimate")}})
        except BagError as error:
            bags.append({"name": path.name, "error": str(error)})
    return {"run": str(run_dir), "workcell": workcell, "calibrations": _calibrations(run_dir / "calibration" / workcell),
            "twins": twins, "rounds": rounds, "agreement": agreement, "bags": bags}


def _calibrations(folder: Path) -> list[dict]:
    """Each calibration file's figures, and the calibrated pose against the camera's mount in
    the workcell description (its pose in the file's parent frame: the robot's base for a
    static camera, the link it rides on for a wrist camera; fixed either way)."""
    import yaml

    from twinloop_calibration.calibration_io import CalibrationFileError, from_described_mount, read_camera_mount
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.workcell import load_workcell

    found = []
    workcell = kinematics = None
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            document = yaml.safe_load(path.read_text())
            setup = str(document["setup"])
            parent, parent_T_camera = read_camera_mount(path, setup)
        except CalibrationFileError as error:
            found.append({"file": path.name, "error": " ".join(str(error).split())})
            continue
        except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
            found.append({"file": path.name, "error": f"not a calibration file of `twinloop calibrate` "
                          f"({type(error).__name__}: {error})"})
            continue
        entry = {"file": path.name, "camera": document.get("camera", ""), "setup": setup,
                 **{k: document.get(k) for k in ("std_1sigma", "reprojection_rms_px", "held_out_rms_px", "views_used")}}
        if workcell is None:
            workcell = load_workcell()
            kinematics = UrdfTransforms(workcell.urdf_xml)
        # a camera or frame the description does not have: nothing to compare with
        distance = from_described_mount(str(entry["camera"]), parent, parent_T_camera, workcell, kinematics)
        if distance is not None:
            entry["from_urdf_mount"] = {"translation_mm": round(distance[0] * 1e3, 3),
                                        "rotation_deg": round(math.degrees(distance[1]), 4)}
        found.append(entry)
    return found


def write_loop_report(run_dir: Path, workcell: str = "emulated") -> tuple[Path, Path]:
    """RUN_DIR/report.json and RUN_DIR/report.html (both rewritten: they are the run's summary)."""
    import plotly.graph_objects as go

    body = collect(run_dir, workcell)
    (run_dir / "report.json").write_text(json.dumps(body, indent=1))
    figures = []

    # Parameters of each identified version against the nominal v0 (its mean = 1), with 1-sigma bars.
    base = body["twins"][0]["parameters"]
    names = [n for n in base if base[n]["mean"] and any(t["parameters"][n]["identifiable"] for t in body["twins"][1:])]
    if names:
        figure = go.Figure()
        prior = [base[n]["std"] / abs(base[n]["mean"]) for n in names]
        figure.add_trace(go.Scatter(x=names, y=[1.0] * len(names), mode="markers", name="v0 (nominal prior)",
                                    error_y={"type": "data", "array": prior}, marker={"color": "grey"}))
        for twin in body["twins"][1:]:
            p = twin["parameters"]
            figure.add_trace(go.Scatter(
                x=names, y=[p[n]["mean"] / base[n]["mean"] for n in names], mode="markers",
                name=f"v{twin['version']} ({twin['created_by']})",
                error_y={"type": "data", "array": [p[n]["std"] / abs(base[n]["mean"]) for n in names]}))
        figure.update_layout(title="Parameters of each version relative to the nominal v0 (mean ± std; parameters "
                             "some version identified)", yaxis_title="x nominal", height=520)
        figures.append(figure)

    # Success per policy: real, and each twin's prediction, with 95 % Wilson intervals.
    if body["rounds"]:
        figure = go.Figure()
        policies = sorted({r["policy"] for r in body["rounds"]})
        real = {r["policy"]: r for r in body["rounds"]}
        figure.add_trace(go.Bar(x=policies, y=[real[p]["real_rate"] for p in policies], name="real (box tracker)",
                                error_y=_interval([real[p] for p in policies], "real")))
        for twin_label in sorted({r["twin"] for r in body["rounds"]}):
            of_twin = {r["policy"]: r for r in body["rounds"] if r["twin"] == twin_label}
            shown = [p for p in policies if p in of_twin]
            figure.add_trace(go.Bar(x=shown, y=[of_twin[p]["twin_rate"] for p in shown],
                                    name=f"{twin_label} predicts", error_y=_interval([of_twin[p] for p in shown],
                                                                                    "twin")))
            posterior = [p for p in shown if of_twin[p]["twin_posterior_rate"] is not None]
            if posterior:
                figure.add_trace(go.Bar(x=posterior, y=[of_twin[p]["twin_posterior_rate"] for p in posterior],
                                        name=f"{twin_label} over its posterior draws"))
        figure.update_layout(title="Success per policy: the cell and each twin version's prediction (95 % Wilson "
                             "interval)", barmode="group", yaxis_range=[0, 1.05], height=450)
        figures.append(figure)

    calibrations = "".join(
        f"<tr><td>{html.escape(c['file'])}</td><td>{html.escape(str(c.get('camera', '')))}</td>"
        f"<td>{html.escape(str(c.get('setup', '')))}</td>" + (
            f"<td colspan='4'>{html.escape(c['error'])}</td>" if "error" in c else
            f"<td>{c['views_used']}</td><td>{c['reprojection_rms_px']} / {c['held_out_rms_px']}</td>"
            f"<td>{c['std_1sigma']['translation_mm']} mm, {c['std_1sigma']['rotation_deg']} deg</td>"
            + (f"<td>{c['from_urdf_mount']['translation_mm']} mm, {c['from_urdf_mount']['rotation_deg']} deg</td>"
               if "from_urdf_mount" in c else "<td>-</td>")) + "</tr>"
        for c in body["calibrations"])
    lineage = "".join(
        f"<tr><td>v{t['version']}</td><td>{html.escape(t['created_by'])}</td>"
        f"<td>{'-' if t['parent'] is None else 'v' + str(t['parent'])}</td>"
        f"<td>{html.escape(_standing(t['standing']))}</td><td>{html.escape(_geometry(t['geometry']))}</td>"
        f"<td>{html.escape(t['note'])}</td></tr>" for t in body["twins"])
    rounds = "".join(
        f"<tr><td>{html.escape(r['folder'])}</td><td>{html.escape(r['policy'])}</td><td>{html.escape(r['twin'])}</td>"
        f"<td>{r['real_successes']}/{r['trials']}</td><td>{r['twin_successes']}/{r['trials']}</td>"
        f"<td>{'-' if r['twin_posterior_rate'] is None else format(r['twin_posterior_rate'], '.0%')}</td>"
        f"<td>{r['envelope_rejected']}</td><td>{r['envelope_faults']}</td>"
        f"<td>{html.escape(_standing(r['staleness']))}</td></tr>" for r in body["rounds"])
    agreement = "".join(
        f"<tr><td>{html.escape(t)}</td><td>{html.escape(a['basis'])}</td><td>{_two_digits(a['pearson_r'])}</td>"
        f"<td>{a['mmrv']:.3f}</td>"
        f"<td>{html.escape(', '.join(a['policies']))}</td></tr>"
        for t, a in body["agreement"].items())
    bags = "".join(
        f"<tr><td>{html.escape(b['name'])}</td><td>{html.escape(b.get('split', ''))}</td>"
        f"<td>{html.escape(b.get('purpose', ''))}</td>"
        f"<td>{html.escape(', '.join(f'{t} {n}' for t, n in b.get('messages', {}).items()) or b.get('error', ''))}</td>"
        f"<td>{html.escape(', '.join(f'{t} {n}' for t, n in b.get('dropped_estimate', {}).items()) or '0')}</td></tr>"
        for b in body["bags"])
    plots = "".join(figure.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, figure in enumerate(figures))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>twinloop loop: "
            f"{html.escape(run_dir.name)}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #999;padding:3px 8px}"
            "</style></head><body>"
            f"<h1>The loop in {html.escape(str(run_dir))}</h1>"
            "<h2>Camera calibration</h2><table><tr><th>file</th><th>camera</th><th>setup</th><th>views</th>"
            "<th>reprojection / held-out RMS (px)</th><th>uncertainty (1 sigma)</th><th>from the URDF mount</th></tr>"
            f"{calibrations or '<tr><td colspan=7>no calibration in this run</td></tr>'}</table>"
            "<h2>Twin versions (lineage)</h2><table><tr><th>version</th><th>made by</th><th>parent</th>"
            f"<th>standing</th><th>measured geometry</th><th>why</th></tr>{lineage}</table>"
            "<h2>Validation rounds</h2><table><tr><th>round</th><th>policy</th><th>twin</th><th>real success</th>"
            "<th>twin predicts</th><th>over its posterior draws</th><th>commands rejected</th><th>faults</th><th>staleness</th></tr>"
            f"{rounds}</table>"
            "<h2>Sim-vs-real agreement per twin version</h2><table><tr><th>twin</th><th>predicted from</th><th>Pearson r</th><th>MMRV</th>"
            f"<th>policies</th></tr>{agreement}</table>"
            f"{plots}"
            "<h2>Recordings</h2><table><tr><th>bag</th><th>split</th><th>purpose</th><th>messages</th>"
            f"<th>recorder's drop estimate</th></tr>{bags}</table>"
            "<p>Every number from report.json beside this page, read from the run's calibration, twin versions, "
            "validation rounds and bags.</p></body></html>")
    (run_dir / "report.html").write_text(page)
    return run_dir / "report.json", run_dir / "report.html"


def _interval(rounds: list[dict], key: str) -> dict:
    rates = np.array([r[f"{key}_rate"] for r in rounds])
    low = np.array([r[f"{key}_interval"][0] for r in rounds])
    high = np.array([r[f"{key}_interval"][1] for r in rounds])
    return {"type": "data", "symmetric": False, "array": list(high - rates), "arrayminus": list(rates - low)}


def _geometry(geometry: dict | None) -> str:
    if geometry is None:
        return "described"
    x, y, z = geometry["box_position_m"]
    objects = geometry["objects"]
    return (f"table top {geometry['table_top_height_m']:.4f} m; box at ({x:.4f}, {y:.4f}, {z:.4f}) m; "
            + (f"new objects: {', '.join(objects)}" if objects else "no new object"))


def _two_digits(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _standing(standing: dict | None) -> str:
    if not standing or standing.get("stale") is None and "state" not in standing:
        return "not checked"
    if "state" in standing:
        return f"{standing['state']}: {standing['evidence']}"
    return f"{'stale' if standing['stale'] else 'current'}: {standing['evidence']}"
