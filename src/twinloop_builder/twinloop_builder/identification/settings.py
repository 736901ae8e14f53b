"""What identification is asked to do: parameter names, settings, errors. Pure Python."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

JOINT_QUANTITIES = ("friction_loss", "damping", "armature")
GAIN_QUANTITIES = ("kp", "kv")
BOX_PARAMETERS = ("box.mass_kg", "box.friction", "finger.friction")
DELAY = "command.delay_s"
BOX_BODY = "box"
DELAY_UNIT_S = 0.01  # the delay is optimized in units of 10 ms, so every variable is O(1)

ProgressFn = Callable[[str, float, str], None]  # (stage, fraction 0..1, message)


class IdentificationError(ValueError):
    """Identification cannot run on the given data; the message says what to record."""

    code = "DEGENERATE_DATA"


class IdentificationCancelled(RuntimeError):
    pass


@dataclass(frozen=True)
class IdentificationSettings:
    position_std_rad: float = 1e-4  # weight of joint position residuals (≈ encoder noise)
    effort_std_nm: float = 0.1  # weight of joint effort residuals (≈ torque sensor noise)
    box_position_std_m: float = 1e-3  # weight of box position residuals (≈ perception noise)
    push_effort_std_nm: float = 1.0  # weight of efforts while pushing (contact makes them spiky)
    max_iterations: int = 12
    confidence: float = 0.95  # level of the reported confidence intervals
    # s: lag window of the intervals' Newey-West covariance. Over six drawn truths
    # (bench/uncertainty_calibration.py --seeds 0-5, 10 s each) 0.2 s put 91.2 % of the true
    # values inside their 95 % intervals (z RMS 1.18); 1.0 s 86.1 % (1.28): a longer window
    # does not widen the intervals.
    interval_lag_s: float = 0.2
    # The residual stage after identification (twinloop_builder.residual_fit): "auto" trains a
    # learned joint-torque residual where the identified twin leaves a systematic error on the
    # fit recordings' validation part and keeps it where it helps; "off" never does.
    residual: str = "auto"
    min_motion_rad: float = 0.05  # a joint whose travel is below this is "never moved"
    min_finger_motion_m: float = 0.004  # the same for prismatic joints
    max_relative_std: float = 0.1  # identifiable when std <= this fraction of the value
    max_residual_rms: float = 8.0  # residual rms (noise units) above which a stage's fit is not trusted
    multiplier_bounds: tuple[float, float] = (0.2, 5.0)  # search range, x the prior value
    delay_bounds_s: tuple[float, float] = (0.001, 0.09)
    # Finite-difference step (relative in the log-parametrization). 1e-5 was within the
    # simulation's numerical noise for small-inertia parameters: the Jacobian column of joint
    # 5's armature was noise, Levenberg-Marquardt stopped 2.5 % off (14 sigma) with a lower
    # cost at the truth, and gains came out 5 sigma off; 1e-3 fixed both on the same bags.
    fd_step: float = 1e-3
    xtol: float = 1e-6  # stop when the step is below this, relative to |x| (log-multipliers)
    # Stop once an accepted step moves the fit by less than this many standard deviations
    # (its cost reduction is below this squared times the residual variance).
    converged_step_sigma: float = 0.1
    # Levenberg-Marquardt: the regularizer's growth after a failed step. MuJoCo's default
    # (10**0.1) spends ~10 full rollouts per decade; 10**0.5 reached the same optimum (same
    # cost to 6 digits) with half the residual evaluations on the second truth file.
    lm_mu_factor: float = 10 ** 0.5
    block_steps: int = 100  # rollout block length (memory bound)
    min_duration_s: float = 5.0
    push_margin_s: tuple[float, float] = (0.4, 0.8)  # s before / after the box moves
    # The box moves where its tracked position changes faster than this, measured over at
    # least box_speed_base_s: between two frames a few ms apart, the tracker's sub-mm jitter
    # alone reads as more than 0.01 m/s (a push moved the box 20-45 mm in 0.1-0.3 s).
    box_speed_threshold_m_s: float = 0.01
    # s: also the span of the poses whose median places the box before a stretch of motion
    # ([start - 2 base, start - base)) and after it ((end, end + base])
    box_speed_base_s: float = 0.3
    # m: a stretch of box motion counts as a push only where the box's median position after
    # it is this far from the one before (a tracked pose that jumps while the arm hides the
    # box and comes back is not a push)
    box_moved_m: float = 0.003
    # m: fingers stalled this far short of their target hold something (a lift's grasp)
    holding_lead_m: float = 0.01
    # m/s: stalled is slower than this. A finger still closing (0.1 m/s) can lag by 1 cm a
    # target that a ragged command stream moves in steps, without holding anything.
    holding_speed_m_s: float = 0.005
    # the box's poses: 'tracked' (the box tracker's, recorded from the camera: what a real cell
    # has) or 'ground_truth' (a simulator's own; only for tests and benchmarks that score this)
    box_source: str = "tracked"
    push_max_evaluations: int = 150  # Nelder-Mead budget of the push stage (~0.1 s per evaluation and push)
    push_start_samples: int = 16  # points over the whole search range that pick the push stage's start (0: none)
    push_surface_samples: int = 40  # cost samples of the push stage's response surface
    push_surface_radius: float = 0.1  # half-width of the sampled region, in log-multipliers (~ +-10 %)
    threads: int = 0  # 0: os.cpu_count()
    delay_stage_iterations: int = 8  # iterations of the continuous-delay stage (the final stage refines)
