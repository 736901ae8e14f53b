"""Held-out trials scored against the twin: what the real cell did, what the twin predicts.

Pure Python (no rclpy). A trial is one bag the policy runner recorded with split
`held_out` (the trial profile: joint states, commands, the box tracker's pose, the envelope
monitor's status). Scoring reads only what a real cell records:

- **Real outcome** from the box tracker (`/twinloop/perception/box_pose`): the box's start
  (median of the first `window_s` of poses) and end (median of the last), judged by the
  policy's own test (within `goal_radius_m` of `goal_box_xy`), as the runner judges it.
- **Twin prediction**: the trial replayed in the twin version (twinloop_sim.replay: same
  initial joint state, the recorded commands at the times they took effect, the box put
  where the tracker first saw it): the box's end in the twin, judged by the same test.
- **Errors**: per-joint and end-effector RMSE of the replay, the box's end in the twin
  against the tracker's, the command-to-motion latency (the shift of the measured arm
  positions that best matches the commanded targets), envelope interventions (commands
  the monitor rejected, a fault).
- **Failure mode**: success; `fault` (the monitor faulted); `miss` (the box never left the
  table and did not move: no grasp); `slip` (it moved toward the goal but ended short);
  `overshoot` (it ended beyond the goal); `off_target` (beside it).
- **Staleness** (a posterior predictive check): the trial also replayed under `draws`
  samples of the twin's identified parameters (mean +- std); per arm joint, the spread
  of those replays around the twin's mean replay is the error the twin's own uncertainty
  predicts. The trial's z is the worst joint's observed RMSE over that prediction (with a
  floor of `SPREAD_FLOOR_RAD` for joints the trial hardly moves). A round whose median z
  exceeds `stale_z` marks the twin stale: the cell no longer behaves as the twin's
  uncertainty allows (maintenance, a changed payload, wear). A twin that identified
  nothing (v0) has no uncertainty to check against: staleness is then unknown.

A simulator's ground-truth box topic, where a bag has one, is never read here (tests use it
to score the tracker).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from twinloop_logging.bag_reader import BagError, open_bag
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC
from twinloop_twin.statistics import wilson_interval

ENVELOPE_STATUS_TOPIC = "/twinloop/envelope/status"
STATE_FAULT = 2  # twinloop_interfaces/EnvelopeStatus
FAILURE_MODES = ("success", "fault", "miss", "slip", "overshoot", "off_target")
LIFT_M = 0.01  # the box's height above its start that counts as lifted
MOVED_M = 0.02  # a box that moved less (and was not lifted) was never grasped
SPREAD_FLOOR_RAD = 0.001  # the least predicted error per joint: ~the arm's tracking noise in a replay
STALE_Z = 3.0  # a round's median z above this marks the twin stale


class ValidationError(ValueError):
    """A bag or a setting cannot be scored; the message says why and what to do."""


@dataclass(frozen=True)
class BoxGoal:
    xy: tuple[float, float]
    radius_m: float

    def reached(self, xy: Sequence[float]) -> bool:
        return bool(np.hypot(xy[0] - self.xy[0], xy[1] - self.xy[1]) <= self.radius_m)


@dataclass(frozen=True)
class TrackedBox:
    """The box as the tracker reported it during one trial (s from the first joint state)."""

    t: np.ndarray
    xyz: np.ndarray  # (N, 3)

    def start(self, window_s: float) -> np.ndarray:
        return np.median(self.xyz[self.t <= self.t[0] + window_s], axis=0)

    def end(self, window_s: float) -> np.ndarray:
        return np.median(self.xyz[self.t >= self.t[-1] - window_s], axis=0)


@dataclass(frozen=True)
class EnvelopeRecord:
    faulted: bool
    fault_reason: str
    commands_rejected: int  # during the trial


@dataclass(frozen=True)
class TrialScore:
    bag: str
    real_success: bool
    twin_success: bool
    failure_mode: str
    box_start_xy: tuple[float, float]  # the tracker's
    real_box_end_xy: tuple[float, float]  # the tracker's
    twin_box_end_xy: tuple[float, float]  # the replay's
    box_end_error_m: float  # twin vs tracker, in the table plane
    joint_rmse_rad: dict[str, float]
    end_effector_rmse_m: float
    command_latency_s: float
    envelope_rejected: int
    envelope_fault: str  # '' when none
    replay_bag: str = ""  # the twin's response, where the scoring wrote one
    predicted_spread_rad: dict[str, float] = field(default_factory=dict)  # per arm joint; empty: not checked
    staleness_z: float = float("nan")  # worst arm joint's observed RMSE / predicted spread
    # the fraction of the twin's posterior draws (the staleness check's replays) in which the
    # box ends at the goal: the twin's prediction with its measured uncertainty; NaN: no draws
    twin_success_draws: float = float("nan")


def read_tracked_box(bag, start_ns: int, topic: str = TRACKED_BOX_POSE_TOPIC) -> TrackedBox:
    if topic not in bag.topics or bag.topics[topic].count == 0:
        raise ValidationError(f"{bag.path} has no {topic}: run the box tracker while trials are recorded (the "
                              "trial profile records it); a trial's outcome is judged by it")
    t, xyz = [], []
    for message in bag.messages([topic]):
        stamp = message.msg.header.stamp
        p = message.msg.pose.pose.position
        t.append((stamp.sec * 1_000_000_000 + stamp.nanosec - start_ns) * 1e-9)
        xyz.append((p.x, p.y, p.z))
    order = np.argsort(t)
    return TrackedBox(np.asarray(t)[order], np.asarray(xyz, dtype=float)[order])


def read_envelope(bag) -> EnvelopeRecord:
    """Fault and rejected commands from the monitor's latched status during the trial."""
    if ENVELOPE_STATUS_TOPIC not in bag.topics:
        return EnvelopeRecord(False, "", 0)
    statuses = [m.msg for m in bag.messages([ENVELOPE_STATUS_TOPIC])]
    fault = next((s for s in statuses if s.state == STATE_FAULT), None)
    rejected = [int(s.commands_rejected) for s in statuses]
    return EnvelopeRecord(fault is not None, fault.reason if fault is not None else "",
                          (max(rejected) - min(rejected)) if rejected else 0)


def command_latency_s(state_t: np.ndarray, measured: np.ndarray, command_t: np.ndarray, commanded: np.ndarray,
                      max_lag_s: float = 0.3, step_s: float = 0.002) -> float:
    """The delay of the measured positions behind the commanded targets: the shift that
    minimises their mean squared difference over the moving part of the trial (arm
    joints). It includes the controller's tracking lag, as a user feels it."""
    if len(command_t) < 2:
        return float("nan")
    lags = np.arange(0.0, max_lag_s + 1e-9, step_s)
    inside = (state_t >= command_t[0] + max_lag_s) & (state_t <= command_t[-1])
    if inside.sum() < 10:
        return float("nan")
    t = state_t[inside]
    q = measured[inside]

    def cost(lag: float) -> float:
        shifted = np.stack([np.interp(t - lag, command_t, commanded[:, j]) for j in range(commanded.shape[1])], axis=1)
        return float(np.mean((shifted - q) ** 2))
    return float(lags[int(np.argmin([cost(lag) for lag in lags]))])


def classify(goal: BoxGoal, start: np.ndarray, end: np.ndarray, peak_lift_m: float, faulted: bool) -> str:
    if faulted:
        return "fault"
    if goal.reached(end):
        return "success"
    moved = float(np.hypot(*(end[:2] - start[:2])))
    if peak_lift_m < LIFT_M and moved < MOVED_M:
        return "miss"
    to_goal = np.asarray(goal.xy) - start[:2]
    distance = float(np.linalg.norm(to_goal))
    along = float(np.dot(end[:2] - start[:2], to_goal / distance)) if distance > 0 else 0.0
    step = end[:2] - start[:2]
    across = float(abs(to_goal[0] * step[1] - to_goal[1] * step[0]) / distance) if distance > 0 else moved
    if across > goal.radius_m:
        return "off_target"
    return "overshoot" if along > distance else "slip"


@dataclass
class TrialScorer:
    """Scores trial bags of one policy against one twin version (loaded once)."""

    twin_path: Path
    goal: BoxGoal
    window_s: float = 0.3
    draws: int = 8  # posterior samples per trial for the staleness check (0: none)
    seed: int = 0
    workers: int = 2  # draws replayed at once (threads)
    _sim: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        from twinloop_sim.workcell_sim import WorkcellSimulation
        from twinloop_twin.bundle import load_twin
        from twinloop_twin.kinematics import UrdfTransforms
        from twinloop_twin.nominal import load_scene, load_twin_workcell
        from twinloop_twin.parameters import ParameterSet
        from twinloop_twin.residual import load_residual

        twin = load_twin(Path(self.twin_path))
        workcell = load_twin_workcell(twin)
        self.twin_label = f"{twin.workcell}/v{twin.version}"
        self.twin_version = twin.version
        # the bags it was fit on (held-out ones in its provenance only scored it: they may be judged again)
        self._fit_bags = {bag.sha256 for bag in twin.manifest.provenance.source_bags if bag.split == "fit"}
        self._workcell = workcell
        model = load_scene(twin)
        residual = load_residual(twin, model)  # the version's learned residual, where it has one
        self._residual_weights = residual.weights if residual is not None else None
        self._sim = WorkcellSimulation(workcell, model=model, residual=residual)
        self._kinematics = UrdfTransforms(workcell.urdf_xml)
        self._rest_z = float(self._sim.box_qpos()[2])
        # the identified parameters with a measured spread: what the staleness check samples
        # what the twin's spread is drawn over: the identified parameters with an uncertainty
        self.uncertain = ParameterSet({n: p for n, p in twin.parameters.items() if p.identifiable and p.std > 0})
        self._rng = np.random.default_rng(self.seed)

    def score(self, bag_path: Path | str, replay_dir: Path | None = None) -> TrialScore:
        """Score one trial bag; with `replay_dir`, also write the twin's response there as a
        bag (twinloop_sim.replay.write_replay_bag), which the HTML report plots."""
        from twinloop_builder.recording import bag_sha256
        from twinloop_sim.replay import ReplayError, load_recorded_run, replay, response_bag_path, write_replay_bag

        bag_path = Path(bag_path)
        if bag_path.exists() and bag_sha256(bag_path) in self._fit_bags:
            raise ValidationError(f"{bag_path} is a recording twin {self.twin_label} was built from (its provenance): "
                                  "a twin is judged on trials it has not seen; record new held-out trials")
        try:
            with open_bag(bag_path) as bag:  # the split first: nothing else is read from a fit bag
                session = bag.session
                if session is None or session.split != "held_out":
                    split = session.split if session is not None else "no session metadata"
                    raise ValidationError(f"{bag_path} was recorded with split '{split}': validation judges only "
                                          "held-out trials (record them with `twinloop validate run`, or "
                                          "`twinloop trials --split held_out`)")
                run = load_recorded_run(bag_path, list(self._sim.commandable_joints), bag=bag)
                box = read_tracked_box(bag, run.start_ns)
                envelope = read_envelope(bag)
        except (BagError, ReplayError) as error:
            raise ValidationError(str(error)) from error
        start, end = box.start(self.window_s), box.end(self.window_s)
        # The twin's box starts where the tracker first saw it, resting on the twin's table.
        run.box_t, run.box_xyz = np.array([0.0]), np.array([[start[0], start[1], self._rest_z]])
        result = replay(run, self._sim, self._kinematics)
        response = ""
        if replay_dir is not None:
            try:
                response = str(write_replay_bag(response_bag_path(replay_dir, bag_path, self.twin_version), run,
                                                result, every=5))
            except ReplayError as error:
                raise ValidationError(str(error)) from error
        twin_end = result.twin_box_xyz[-1]
        arm = [j for j in result.joint_names if not j.startswith("panda_finger")]
        columns = [run.joint_names.index(j) for j in arm]
        command_t = np.array([t for t, targets in run.commands if all(j in targets for j in arm)])
        commanded = np.array([[targets[j] for j in arm] for _, targets in run.commands if all(j in targets for j in arm)])
        latency = command_latency_s(run.state_t, run.state_q[:, columns], command_t,
                                    commanded.reshape(len(command_t), len(arm)))
        real_success = self.goal.reached(end) and not envelope.faulted
        spread, z, draws_reached = self._staleness(run, result, arm)
        return TrialScore(
            bag=str(bag_path), real_success=real_success, twin_success=self.goal.reached(twin_end),
            failure_mode=classify(self.goal, start, end, float(box.xyz[:, 2].max() - start[2]), envelope.faulted),
            box_start_xy=(float(start[0]), float(start[1])), real_box_end_xy=(float(end[0]), float(end[1])),
            twin_box_end_xy=(float(twin_end[0]), float(twin_end[1])),
            box_end_error_m=float(np.hypot(*(twin_end[:2] - end[:2]))),
            joint_rmse_rad={j: float(r) for j, r in zip(result.joint_names, result.joint_rmse_rad)},
            end_effector_rmse_m=float(result.end_effector_rmse_m), command_latency_s=latency,
            envelope_rejected=envelope.commands_rejected, envelope_fault=envelope.fault_reason, replay_bag=response,
            predicted_spread_rad=spread, staleness_z=z, twin_success_draws=draws_reached)

    def _staleness(self, run, result, arm: list[str]) -> tuple[dict[str, float], float, float]:
        """(per-joint predicted spread, z, the fraction of draws whose box ends at the goal) of
        one trial; ({}, NaN, NaN) without draws or uncertainty."""
        import copy

        from twinloop_sim.replay import simulate
        from twinloop_sim.workcell_sim import WorkcellSimulation
        from twinloop_twin.model_parameters import apply_parameters, sample_parameters
        from twinloop_twin.residual import ResidualTorque

        if self.draws <= 0 or not self.uncertain:
            return {}, float("nan"), float("nan")
        mean_columns = [result.joint_names.index(j) for j in arm]
        mean_q = result.twin_q[:, mean_columns]
        samples = [sample_parameters(self.uncertain, self._rng) for _ in range(self.draws)]  # in order: seeded

        def one(sample) -> tuple[np.ndarray, bool]:
            # all a draw writes is its own (model, simulation); it needs only the twin's motion,
            # not the comparison with the recording (end-effector error, alignment)
            model = copy.copy(self._sim.model)
            apply_parameters(model, sample)
            residual = None if self._residual_weights is None else ResidualTorque(model, self._residual_weights)
            _, twin_q, twin_box = simulate(run, WorkcellSimulation(self._workcell, model=model, residual=residual))
            return np.mean((twin_q[:, mean_columns] - mean_q) ** 2, axis=0), self.goal.reached(twin_box[-1])

        with ThreadPoolExecutor(max(1, self.workers)) as pool:  # MuJoCo steps without holding the GIL
            outcomes = list(pool.map(one, samples))
        squares = np.zeros(len(arm))
        reached = 0
        for square, hit in outcomes:  # summed in draw order: the same numbers with any number of workers
            squares += square
            reached += hit
        spread = np.sqrt(squares / self.draws + SPREAD_FLOOR_RAD ** 2)
        observed = np.array([result.joint_rmse_rad[result.joint_names.index(j)] for j in arm])
        return {j: float(v) for j, v in zip(arm, spread)}, float(np.max(observed / spread)), reached / self.draws


@dataclass(frozen=True)
class RoundSummary:
    """One validation round: a policy's held-out trials against a twin version."""

    trials: int
    real_successes: int
    real_rate: float
    real_interval: tuple[float, float]  # Wilson 95 %
    twin_successes: int
    twin_rate: float
    twin_interval: tuple[float, float]
    # the mean over trials of the twin's posterior draws reaching the goal (TrialScore.
    # twin_success_draws): its success rate with its measured uncertainty; NaN: no draws
    twin_posterior_rate: float
    agreement: float  # trials whose twin outcome equals the real one
    failure_modes: dict[str, int]
    box_end_error_m: dict[str, float]  # median, max
    worst_joint_rmse_rad: dict[str, float]  # median, max over trials of the worst arm joint
    end_effector_rmse_m: dict[str, float]
    command_latency_s: float  # median
    envelope_rejected: int
    envelope_faults: int
    staleness: dict  # stale (True/False/None: unknown), median_z, threshold, evidence


def staleness_verdict(scores: Sequence[TrialScore], threshold: float = STALE_Z) -> dict:
    """Is the twin stale, by the round's median z, with the evidence in words."""
    checked = [s for s in scores if np.isfinite(s.staleness_z)]
    if not checked:
        return {"stale": None, "median_z": None, "threshold": threshold,
                "evidence": "not checked: the twin has no identified uncertainty (or --draws 0)"}
    median = float(np.median([s.staleness_z for s in checked]))
    worst = max(checked, key=lambda s: s.staleness_z)
    joint = max(worst.predicted_spread_rad, key=lambda j: worst.joint_rmse_rad[j] / worst.predicted_spread_rad[j])
    stale = median > threshold
    return {"stale": stale, "median_z": median, "threshold": threshold, "evidence": (
        f"median z {median:.1f} over {len(checked)} trial(s) ({'above' if stale else 'within'} {threshold:g}); worst "
        f"{joint} in {Path(worst.bag).name}: {worst.joint_rmse_rad[joint] * 1e3:.1f} mrad observed against "
        f"{worst.predicted_spread_rad[joint] * 1e3:.1f} mrad the twin's uncertainty predicts")}


def summarize(scores: Sequence[TrialScore], stale_z: float = STALE_Z) -> RoundSummary:
    if not scores:
        raise ValidationError("no trials to summarize")
    n = len(scores)
    real = sum(s.real_success for s in scores)
    twin = sum(s.twin_success for s in scores)

    def spread(values) -> dict[str, float]:
        v = np.asarray(values, dtype=float)
        return {"median": float(np.median(v)), "max": float(np.max(v))}
    worst = [max(r for j, r in s.joint_rmse_rad.items() if not j.startswith("panda_finger")) for s in scores]
    latencies = [s.command_latency_s for s in scores if np.isfinite(s.command_latency_s)]
    drawn = [s.twin_success_draws for s in scores if np.isfinite(s.twin_success_draws)]
    return RoundSummary(
        trials=n, real_successes=real, real_rate=real / n, real_interval=wilson_interval(real, n),
        twin_successes=twin, twin_rate=twin / n, twin_interval=wilson_interval(twin, n),
        twin_posterior_rate=float(np.mean(drawn)) if len(drawn) == n else float("nan"),
        agreement=sum(s.real_success == s.twin_success for s in scores) / n,
        failure_modes={m: sum(s.failure_mode == m for s in scores) for m in FAILURE_MODES},
        box_end_error_m=spread([s.box_end_error_m for s in scores]), worst_joint_rmse_rad=spread(worst),
        end_effector_rmse_m=spread([s.end_effector_rmse_m for s in scores]),
        command_latency_s=float(np.median(latencies)) if latencies else float("nan"),
        envelope_rejected=sum(s.envelope_rejected for s in scores),
        envelope_faults=sum(bool(s.envelope_fault) for s in scores), staleness=staleness_verdict(scores, stale_z))


def report(scores: Sequence[TrialScore], summary: RoundSummary, **context) -> dict:
    """Every number of the round, JSON-ready."""
    return {**context, "summary": asdict(summary), "trials": [asdict(s) for s in scores]}


def format_trial(index: int, score: TrialScore) -> str:
    return (f"trial {index}: real {'success' if score.real_success else 'failure'} ({score.failure_mode}), twin "
            f"{'success' if score.twin_success else 'failure'}; box end twin vs tracker "
            f"{score.box_end_error_m * 100:.1f} cm; end-effector RMSE {score.end_effector_rmse_m * 1e3:.1f} mm; "
            f"latency {score.command_latency_s * 1e3:.0f} ms; {score.envelope_rejected} rejected"
            + (f"; staleness z {score.staleness_z:.1f}" if np.isfinite(score.staleness_z) else "")
            + (f"; twin's draws {score.twin_success_draws:.0%} success" if np.isfinite(score.twin_success_draws)
               else "")
            + (f"; fault: {score.envelope_fault}" if score.envelope_fault else ""))


def format_summary(summary: RoundSummary) -> str:
    lo, hi = summary.real_interval
    tlo, thi = summary.twin_interval
    return (f"real success {summary.real_successes}/{summary.trials} ({summary.real_rate:.0%}, 95 % CI "
            f"{lo:.0%}-{hi:.0%}); twin predicts {summary.twin_successes}/{summary.trials} ({summary.twin_rate:.0%}, "
            f"{tlo:.0%}-{thi:.0%}" + (f"; {summary.twin_posterior_rate:.0%} over its posterior draws"
                                     if np.isfinite(summary.twin_posterior_rate) else "")
            + f"); outcomes agree in {summary.agreement:.0%}; box end error median "
            f"{summary.box_end_error_m['median'] * 100:.1f} cm; failure modes "
            + ", ".join(f"{m} {c}" for m, c in summary.failure_modes.items() if c)
            + {True: "; TWIN STALE: ", False: "; twin current: ", None: "; staleness "}[summary.staleness["stale"]]
            + summary.staleness["evidence"])


@dataclass(frozen=True)
class PolicyComparison:
    """Several policies' rounds against one twin: does the twin rank and track them as the cell does?"""

    twin: str
    policies: list[str]
    real_rates: list[float]
    twin_rates: list[float]  # each round's predicted success rate, as `basis` says
    pearson_r: float  # NaN when either side is constant
    mmrv: float  # 0: the twin ranks every pair as the cell does
    # what twin_rates are: "posterior", the rounds' twin_posterior_rate, where every round has
    # one; else "mean", the outcome of the twin's mean parameters (rounds scored without draws)
    basis: str = "mean"


def compare_rounds(reports: Sequence[dict]) -> PolicyComparison:
    """From rounds' report.json contents (one per policy, all against the same twin)."""
    from twinloop_twin.statistics import sim_real_agreement

    if len(reports) < 2:
        raise ValidationError(f"{len(reports)} round(s): compare needs the rounds of at least two policies")
    twins = sorted({r["twin"] for r in reports})
    if len(twins) != 1:
        raise ValidationError(f"the rounds were scored against different twins {twins}: compare policies against "
                              "one twin version (score the bags again with `twinloop validate score --twin`)")
    policies = [r["policy"] for r in reports]
    if len(set(policies)) != len(policies):
        raise ValidationError(f"policies {policies} appear more than once: give one round per policy")
    real = [r["summary"]["real_rate"] for r in reports]
    posterior = [r["summary"].get("twin_posterior_rate") for r in reports]
    basis = "posterior" if all(p is not None and np.isfinite(p) for p in posterior) else "mean"
    twin = [float(p) for p in posterior] if basis == "posterior" else [r["summary"]["twin_rate"] for r in reports]
    agreement = sim_real_agreement(real, twin)
    return PolicyComparison(twins[0], policies, real, twin, agreement.pearson_r, agreement.mmrv, basis)


def format_comparison(comparison: PolicyComparison) -> str:
    lines = [f"{p}: real {r:.0%}, twin {t:.0%}" for p, r, t in
             zip(comparison.policies, comparison.real_rates, comparison.twin_rates)]
    lines.append(f"twin {comparison.twin} ({'over its posterior draws' if comparison.basis == 'posterior' else 'its mean parameters'}) "
                 f"against the cell over {len(comparison.policies)} policies: Pearson r "
                 f"{comparison.pearson_r:.2f}" + (" (one side constant: undefined)" if np.isnan(comparison.pearson_r)
                                                  else "") + f", MMRV {comparison.mmrv:.3f}")
    return "\n".join(lines)
