"""Physics identification of the workcell with MuJoCo's own `mujoco.sysid`. Pure Python.

By stage, one module each: `data` (recordings checked, sorted into arm and push data, cut
into sysid segments), `arm` (joint dynamics, gains, the delay), `push` (box mass and
friction), `identifiability` (estimates, intervals, flags and guidance from a fitted stage),
`held_out` (open-loop prediction error). `model` and `fit` hold what every stage shares (the
identification model, the sysid problem and its least-squares fit); `settings` and
`results` the types; `pipeline.identify` runs the stages in order.

What is identified (names of twinloop_twin.model_parameters):
  joint.<j>.friction_loss|damping|armature, actuator.<j>.kp|kv   (arm stage: joint excitation)
  command.delay_s                                                (arm stage)
  box.mass_kg, box.friction, finger.friction                     (push stage, arm fixed)

How: recordings become `sysid.ModelSequences` (control = the recorded commands on the
physics grid, measured = joint positions, joint efforts and the box pose); `sysid.optimize`
(MuJoCo's Levenberg-Marquardt, `mujoco.minimize`) fits the parameters; the covariance comes
from `sysid.calculate_intervals` at the optimum.

Where we extend or wrap mujoco.sysid, and why:
- build_model: sysid recompiles the MjSpec for every candidate; we write candidates into a
  copy of one compiled model with twinloop_twin.model_parameters.apply_parameters (the same
  code that serves twins), which is what the sim bridge does too and is ~20x cheaper.
- rollout: sysid's default rollout keeps the full physics state of every step; with the
  100-sample command-delay history in the state that is 1648 doubles per step (GBs for a
  30 s recording x 40 finite-difference columns). `fit.BlockedRollout` runs the same
  mujoco.rollout in blocks, on one thread pool, and keeps only the sensor outputs.
- residual: sysid's default divides each signal by its norm (so a joint's weight depends on
  its absolute offset); `fit.weighted_residual` weights by the sensor noise instead, so the
  residual is in units of noise and the covariance is meaningful.
- convergence: mujoco.minimize often ends only when a step fails at a regularizer of 1e8,
  up to ~140 rollouts after the optimum was reached; a stage stops once an accepted step
  moves the fit by less than 0.1 standard deviations (`converged_step_sigma`), and the
  regularizer grows 10**0.5 per failed step instead of 10**0.1 (`lm_mu_factor`).
- command delay: with zero-order hold the delay acts in whole physics steps, a staircase
  a finite-difference Jacobian cannot follow. The identification model reads the delayed
  command with linear interpolation (identical at whole steps, continuous between), the
  delay is bounded below by one step (any delay in (0, dt] acts as dt) and the fit starts
  from a servo-law estimate (linear least squares of the efforts per candidate delay), so it
  cannot slide into delay -> 0 nor absorb a gain error. The final fit holds the delay at the
  whole step that fits best under zero-order hold, as the workcell and the twin's scene act.
- confidence intervals: calculate_intervals assumes white residuals; recorded residuals are
  correlated in time, so the covariance is the Newey-West sandwich (fit.newey_west_scores,
  Bartlett kernel over settings.interval_lag_s). Inflating sysid's covariance by the
  residuals' integrated autocorrelation time instead made the intervals twice too wide.
- push stage: with contacts the residual is chaotic in the parameters (measured: a 0.2 %
  change of the box mass moves the cost by up to 1.9x, in both directions), so a
  finite-difference Jacobian is noise and Levenberg-Marquardt stalls in whichever dip is
  near (three starts ended 6-30 % off). The push stage minimizes the same sysid residual
  with scipy's Nelder-Mead instead, and takes its uncertainty from a quadratic response
  surface of the cost sampled around the optimum: the scatter of the cost about that
  trend is the objective's noise, and a parameter set is as good as the optimum while the
  trend rises by less than it. Directions where the trend does not rise by that much over
  the sampled region (typically mass against box friction: slow pushes feel only the
  sliding force m*mu*g) are reported as not identifiable, with the product when it is.
- identifiability: parameters of a joint that never moved are not fitted at all; others are
  flagged when their relative std exceeds a threshold, with guidance from the correlation
  matrix (which parameter each is confounded with) and from what excites each quantity.
"""
from twinloop_builder.identification.held_out import predict_positions, score_held_out
from twinloop_builder.identification.pipeline import identify, planned_stages
from twinloop_builder.identification.results import (Estimate, HeldOutScore, IdentificationResult, StageFit,
                                                     StageOutcome, StageReport)
from twinloop_builder.identification.settings import (BOX_PARAMETERS, DELAY, GAIN_QUANTITIES, JOINT_QUANTITIES,
                                                      IdentificationCancelled, IdentificationError,
                                                      IdentificationSettings, ProgressFn)

__all__ = ["BOX_PARAMETERS", "DELAY", "Estimate", "GAIN_QUANTITIES", "HeldOutScore", "IdentificationCancelled",
           "IdentificationError", "IdentificationResult", "IdentificationSettings", "JOINT_QUANTITIES", "ProgressFn",
           "StageFit", "StageOutcome", "StageReport", "identify", "planned_stages", "predict_positions",
           "score_held_out"]
