"""One self-contained HTML page per validation round (plotly; plotly.js is embedded, so the
page opens with no network).

Everything on the page is read from the round's artefacts on disk: the numbers from its
report.json, the real trajectories from the trial bags, the twin's from the response bags
the scoring wrote (replays/). Nothing is recomputed here.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from twinloop_logging.bag_reader import open_bag
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC

MAX_TRAJECTORY_TRIALS = 4  # trials whose joint trajectories are drawn (all are in the table)


def _number(value, digits: int = 1) -> str:
    """A report number for the table; '-' where it was not measured (None or NaN)."""
    return "-" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def _arm(names) -> list[int]:
    return [i for i, n in enumerate(names) if not n.startswith("panda_finger")]


def _trajectories(trial_bag: Path, response_bag: Path):
    """(t, q) recorded and (t, q) in the twin, arm joints, s from the first joint state."""
    with open_bag(trial_bag) as bag:
        real = bag.joint_states("/joint_states")
    with open_bag(response_bag) as bag:
        twin = bag.joint_states("/twinloop/sim/joint_states")
    start = real.stamps_ns[0]
    names = [real.names[i] for i in _arm(real.names)]
    twin_columns = [twin.names.index(n) for n in names]
    return (names, (real.stamps_ns - start) * 1e-9, real.position[:, _arm(real.names)],
            (twin.stamps_ns - start) * 1e-9, twin.position[:, twin_columns])


def _box_track(trial_bag: Path) -> np.ndarray:
    with open_bag(trial_bag) as bag:
        return np.array([[m.msg.pose.pose.position.x, m.msg.pose.pose.position.y]
                         for m in bag.messages([TRACKED_BOX_POSE_TOPIC])])


def write_round_html(round_dir: Path) -> Path:
    """report.html beside report.json in `round_dir`; returns its path."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    report = json.loads((round_dir / "report.json").read_text())
    summary, trials = report["summary"], report["trials"]
    goal, radius = report["goal_box_xy"], report["goal_radius_m"]
    figures = []

    # The box on the table: the goal, each trial's tracked path, where the twin put it.
    table = go.Figure()
    angle = np.linspace(0.0, 2 * np.pi, 64)
    table.add_trace(go.Scatter(x=goal[0] + radius * np.cos(angle), y=goal[1] + radius * np.sin(angle),
                               mode="lines", name="goal", line={"color": "green"}))
    for index, trial in enumerate(trials):
        track = _box_track(Path(trial["bag"]))
        table.add_trace(go.Scatter(x=track[:, 0], y=track[:, 1], mode="lines+markers", marker={"size": 3},
                                   name=f"trial {index + 1} tracked ({trial['failure_mode']})"))
        table.add_trace(go.Scatter(x=[trial["twin_box_end_xy"][0]], y=[trial["twin_box_end_xy"][1]], mode="markers",
                                   marker={"symbol": "x", "size": 10}, name=f"trial {index + 1} twin end"))
    table.update_layout(title="The box on the table (m): tracked paths, twin ends, goal", yaxis_scaleanchor="x",
                        height=500)
    figures.append(table)

    # Success: real vs twin, with 95 % Wilson intervals.
    rates = go.Figure()
    for label, key in (("real (box tracker)", "real"), (f"twin {report['twin']} (replay)", "twin")):
        rate, (low, high) = summary[f"{key}_rate"], summary[f"{key}_interval"]
        rates.add_trace(go.Bar(x=[label], y=[rate], error_y={"type": "data", "symmetric": False,
                                                            "array": [high - rate], "arrayminus": [rate - low]},
                               name=label))
    rates.update_layout(title=f"Success rate over {summary['trials']} held-out trials (95 % Wilson interval)",
                        yaxis_range=[0, 1.05], height=400, showlegend=False)
    figures.append(rates)

    # Joint trajectories, real (solid) and twin (dashed).
    for index, trial in enumerate(trials[:MAX_TRAJECTORY_TRIALS]):
        response = trial.get("replay_bag")
        if not response:
            continue
        names, real_t, real_q, twin_t, twin_q = _trajectories(Path(trial["bag"]), Path(response))
        figure = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names)
        for j, name in enumerate(names):
            figure.add_trace(go.Scatter(x=real_t, y=real_q[:, j], name="real", line={"color": "black"},
                                        showlegend=j == 0), row=j + 1, col=1)
            figure.add_trace(go.Scatter(x=twin_t, y=twin_q[:, j], name="twin", line={"color": "orange", "dash": "dash"},
                                        showlegend=j == 0), row=j + 1, col=1)
        figure.update_layout(title=f"Trial {index + 1}: arm joints (rad) against time (s), real vs twin "
                             f"(end-effector RMSE {trial['end_effector_rmse_m'] * 1e3:.1f} mm)",
                             height=180 * len(names))
        figures.append(figure)

    rows = "".join(
        f"<tr><td>{i + 1}</td><td>{'success' if t['real_success'] else 'failure'}</td><td>{t['failure_mode']}</td>"
        f"<td>{'success' if t['twin_success'] else 'failure'}</td><td>{t['box_end_error_m'] * 100:.1f}</td>"
        f"<td>{max(v for j, v in t['joint_rmse_rad'].items() if not j.startswith('panda_finger')) * 1e3:.1f}</td>"
        f"<td>{t['end_effector_rmse_m'] * 1e3:.1f}</td><td>{_number(t['command_latency_s'] * 1e3, 0)}</td>"
        f"<td>{t['envelope_rejected']}</td><td>{html.escape(t['envelope_fault']) or '-'}</td>"
        f"<td>{_number(t['staleness_z'])}</td>"
        f"<td>{html.escape(Path(t['bag']).name)}</td></tr>" for i, t in enumerate(trials))
    header = ("<tr><th>trial</th><th>real</th><th>failure mode</th><th>twin</th><th>box end twin vs tracker (cm)</th>"
              "<th>worst arm joint RMSE (mrad)</th><th>end-effector RMSE (mm)</th><th>latency (ms)</th>"
              "<th>rejected</th><th>fault</th><th>staleness z</th><th>bag</th></tr>")
    plots = "".join(figure.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, figure in enumerate(figures))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>twinloop validation: {html.escape(report['policy'])}"
            f" vs {html.escape(report['twin'])}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "table{border-collapse:collapse}td,th{border:1px solid #999;padding:3px 8px}</style></head><body>"
            f"<h1>Validation: policy {html.escape(report['policy'])} against twin {html.escape(report['twin'])}</h1>"
            f"<p>{html.escape(report['summary_line'])}</p>"
            f"<table>{header}{rows}</table>{plots}"
            "<p>Numbers from report.json beside this page; trajectories from the trial bags and the twin's response "
            "bags (replays/).</p></body></html>")
    path = round_dir / "report.html"
    path.write_text(page)
    return path
