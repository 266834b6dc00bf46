"""Every metric rlhfkit logs, declared once: name, meaning, exact formula, unit and reduction.

This module is data, not dispatch (stdlib only). Trainers reference the constants
(``M.OBJECTIVE_KL``) instead of string literals, so a misspelt metric is an AttributeError at the
first run rather than a silently new dashboard panel. The same declarations produce
``docs/metrics.md`` (metrics/docs.py, ``make docs``; a test keeps the file fresh) and tell
:class:`rlhfkit.metrics.accumulate.MetricAccumulator` how to pool each value across micro-batches and
processes.

Names are the reference documents' names verbatim (TRL's PPO docs); quantities the older TRL
trainer logged under other names keep those as ``aliases``.

Notation used in the formulas (one PPO update; b indexes responses, t response tokens):
  m_bt      response mask, True on real response tokens up to and including the stop token
  logp_bt   log-prob of the sampled token under the policy that generated it (sampling temperature)
  ref_bt    log-prob of the same token under the frozen reference model (same temperature)
  kl_bt     per-token KL estimate: k1 = logp - ref, or k3 = exp(ref - logp) - 1 - (ref - logp)
  R_b       score of response b (reward model or reward function), after the EOS trick
  V_bt, G_bt, A_bt   value prediction at rollout, GAE return, GAE advantage
  r_bt      exp(logp_new - logp_old), the PPO probability ratio during optimisation
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Reduction = Literal["mean", "sum", "var", "std", "min", "max", "last", "histogram"]
Kind = Literal["scalar", "histogram"]

REDUCTIONS: tuple[str, ...] = ("mean", "sum", "var", "std", "min", "max", "last", "histogram")
KINDS: tuple[str, ...] = ("scalar", "histogram")
TRAINERS: tuple[str, ...] = ("ppo", "grpo")
IMPORTANCE: tuple[str, ...] = ("crucial", "stability", "")


@dataclass(frozen=True)
class Metric:
    """One logged quantity.

    name: the key sent to the trackers, spelled as in the reference docs.
    meaning: one line, what the number tells you.
    formula: plain-text definition in the module's notation.
    unit: e.g. "nats/sequence", "nats/token", "fraction", "episodes/s", "count".
    reduction: how values from micro-batches, epochs and processes combine into the logged number:
        "mean" pooled sum/count, "sum", "var"/"std" pooled moments (unbiased), "min", "max",
        "last" (the main process's value as set), "histogram" (raw values gathered from all processes).
    trainers: which trainers log it, a non-empty subset of TRAINERS ("ppo", "grpo"); PPO only unless given.
    kind: "scalar" or "histogram".
    aliases: the names TRL's original PPOTrainer (TRL up to 0.11) logged the quantity under, which may be its current
        name; sent to the trackers only with --log_legacy_names.
    when: condition under which it is logged ("always", "task has a checker", ...).
    importance: "crucial" (the objective), "stability" (watch for divergence) or "".
    watch: what healthy looks like, for the docs and the health checks.
    vs_trl: where our definition deliberately differs from TRL's, and why.
    section: heading in docs/metrics.md; default: from the name's prefix ("objective/..." -> Objective).
    A name containing "{reward_func_name}" is a template: :func:`expand` makes one metric per reward function.
    """

    name: str
    meaning: str
    formula: str
    unit: str
    reduction: Reduction
    trainers: frozenset[str] = field(default_factory=lambda: frozenset({"ppo"}))
    kind: Kind = "scalar"
    aliases: tuple[str, ...] = ()
    when: str = "always"
    importance: str = ""
    watch: str = ""
    vs_trl: str = ""
    section: str = ""

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"{self.name}: reduction {self.reduction!r} is not one of {REDUCTIONS}")
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {KINDS}")
        # A histogram is a distribution of raw values; any other reduction yields one number.
        if (self.kind == "histogram") != (self.reduction == "histogram"):
            raise ValueError(f"{self.name}: kind 'histogram' goes with reduction 'histogram' and only with it")
        if not self.trainers or not set(self.trainers) <= set(TRAINERS):
            raise ValueError(f"{self.name}: trainers {sorted(self.trainers)} must be a non-empty subset of {TRAINERS}")
        if self.importance not in IMPORTANCE:
            raise ValueError(f"{self.name}: importance {self.importance!r} is not one of {IMPORTANCE}")
        for text_field in ("name", "meaning", "formula", "unit", "when"):
            if not getattr(self, text_field).strip():
                raise ValueError(f"{self.name or '<unnamed>'}: {text_field} must not be empty")
        if "\n" in self.meaning:
            raise ValueError(f"{self.name}: meaning must be one line")


PPO = frozenset({"ppo"})
GRPO = frozenset({"grpo"})
BOTH = frozenset({"ppo", "grpo"})

# ----------------------------------------------------------------------------------------------
# PPO scalars (some logged by GRPO too: see `trainers`), one row per logging window of `logging_steps` updates
# (default 1), pooled over the window as `reduction` says (step = update index, 1-based)
# ----------------------------------------------------------------------------------------------

# Run progress
EPS = Metric(
    name="eps",
    meaning="Throughput: episodes (sampled responses) completed per second since train() started.",
    formula="episode / (wall-clock seconds since train() started); covers generation, scoring, optimisation and "
    "sample generation",
    unit="episodes/s",
    reduction="last",
    trainers=BOTH,
    vs_trl="TRL truncates this to an integer; we log the float.",
)
EPISODE = Metric(
    name="episode",
    meaning="Number of episodes (sampled responses) processed so far, counted over all processes.",
    formula="PPO: sum over finished updates, this one included, of the global rollout batch size; GRPO: completions "
    "generated so far, all processes (a batch reused by num_iterations counts once)",
    unit="episodes",
    reduction="last",
    trainers=BOTH,
)
LR = Metric(
    name="lr",
    meaning="Learning rate the optimizer used for this update.",
    formula="the optimizer's learning rate during this step's optimizer steps: learning_rate x the factor of "
    "--lr_scheduler_type's schedule (default linear decay to 0, after an optional warm-up from 0)",
    unit="dimensionless",
    reduction="last",
    trainers=BOTH,
    aliases=("ppo/learning_rate",),
)
LEARNING_RATE = Metric(
    name="learning_rate",
    meaning="Learning rate of this step's optimizer step, under the name TRL's GRPO (transformers' Trainer) logs.",
    formula="the same value as lr",
    unit="dimensionless",
    reduction="last",
    trainers=GRPO,
)
EPOCH = Metric(
    name="epoch",
    meaning="Passes over the training prompts so far (fractional), as transformers' Trainer logs it.",
    formula="prompts drawn so far, all processes / number of prompts in the train split (PPO: episode / prompts; "
    "GRPO: episode / (num_generations x prompts))",
    unit="epochs",
    reduction="last",
    trainers=BOTH,
)
GRAD_NORM = Metric(
    name="grad_norm",
    meaning="Gradient norm before clipping, as transformers' Trainer logs it; spikes come before divergence.",
    formula="total L2 norm of the (all-reduced) gradients of an optimizer step, before max_grad_norm clipping; mean "
    "over the optimizer steps of the logging window whose norm was finite (non-finite ones count in nonfinite_steps)",
    unit="dimensionless",
    reduction="mean",
    trainers=BOTH,
    importance="stability",
    watch="Large jumps, or a steady climb, warn of instability before the loss shows it.",
    vs_trl="TRL logs the last optimizer step's norm; rlhfkit pools the window like every other metric.",
)
STEP_TIME = Metric(
    name="step_time",
    meaning="Wall-clock seconds per training step (rollout or generation, scoring and optimisation), as TRL's GRPO "
    "logs it.",
    formula="seconds from the start of a step to its end (logging, evaluation and checkpoints excluded); mean over "
    "the steps of the logging window and the processes",
    unit="s",
    reduction="mean",
    trainers=BOTH,
)

# The row that ends train(), as transformers' Trainer logs it (Trainer._finalize_training); also train()'s
# TrainOutput.metrics, with epoch.
_SUMMARY = "End of training"
_SUMMARY_WHEN = "once, in the row that ends a train() call (its step is the last step trained)"
TRAIN_RUNTIME = Metric(
    name="train_runtime",
    meaning="Seconds this train() call took, as transformers' Trainer reports it at the end of training.",
    formula="wall-clock seconds from the start of train()'s loop (before the step-0 evaluation) to the end of its "
    "final checkpoint and model save, rounded to 4 decimals (transformers' speed_metrics)",
    unit="s",
    reduction="last",
    trainers=BOTH,
    when=_SUMMARY_WHEN,
    section=_SUMMARY,
)
TRAIN_SAMPLES_PER_SECOND = Metric(
    name="train_samples_per_second",
    meaning="Episodes (PPO responses, GRPO completions) generated per second over this train() call.",
    formula="episodes generated during the call, all processes / train_runtime, rounded to 3 decimals",
    unit="episodes/s",
    reduction="last",
    trainers=BOTH,
    when=_SUMMARY_WHEN,
    section=_SUMMARY,
    vs_trl="transformers counts the samples of the steps trained (per-device batch x accumulation x processes per "
    "step), so TRL's GRPO counts a completion again for each of num_iterations; rlhfkit counts each generated "
    "completion once, as episode does.",
)
TRAIN_STEPS_PER_SECOND = Metric(
    name="train_steps_per_second",
    meaning="Training steps (PPO updates, GRPO optimizer steps) per second over this train() call.",
    formula="steps trained during the call / train_runtime, rounded to 3 decimals",
    unit="steps/s",
    reduction="last",
    trainers=BOTH,
    when=_SUMMARY_WHEN,
    section=_SUMMARY,
)
TOTAL_FLOS = Metric(
    name="total_flos",
    meaning="Floating-point operations of training as transformers' Trainer counts them; rlhfkit counts none.",
    formula="0.0",
    unit="FLOPs",
    reduction="last",
    trainers=BOTH,
    when=_SUMMARY_WHEN,
    section=_SUMMARY,
    vs_trl="TRL's GRPOTrainer reports 0.0 too: transformers estimates 6 x tokens x parameters from a batch's "
    "input_ids, which GRPO's batches do not carry. An honest count would need generation, reference, reward and "
    "value forwards as well.",
)
TRAIN_LOSS = Metric(
    name="train_loss",
    meaning="Mean training loss over the steps of this train() call (TrainOutput.training_loss).",
    formula="GRPO: mean over the call's optimizer steps of loss (each step's over the processes); PPO: mean over the "
    "call's updates of loss/total_avg (each update's pooled token mean over its mini-batches and processes); a step "
    "whose loss is not finite is left out, as transformers' logging_nan_inf_filter leaves it",
    unit="dimensionless",
    reduction="last",
    trainers=BOTH,
    when=_SUMMARY_WHEN,
    section=_SUMMARY,
    vs_trl="GRPO's is TRL's; TRL's PPOTrainer returns no TrainOutput, and rlhfkit's PPO reports the loss each "
    "update minimised, policy plus vf_coef x value loss, as loss/total_avg logs it.",
)

# What RL maximises (measured on the rollout, before the PPO epochs)
OBJECTIVE_RLHF_REWARD = Metric(
    name="objective/rlhf_reward",
    meaning="The quantity PPO maximises: score plus KL penalty per response; it should rise while training works.",
    formula="objective/scores + objective/non_score_reward = mean_b (R_b - kl_coef * sum_t m_bt * kl_bt)",
    unit="reward/sequence",
    reduction="mean",
    trainers=PPO,
    importance="crucial",
    watch="Should trend upward; a rise driven only by objective/scores while task success falls is reward hacking.",
    vs_trl="TRL's docs describe it as score - non_score_reward; like TRL's code we add the (already negative) "
    "penalty.",
)
OBJECTIVE_SCORES = Metric(
    name="objective/scores",
    meaning="Mean score of the sampled responses: the reward model's, or the weighted sum of the reward functions' "
    "and the reward model's (--reward_funcs, --reward_weights).",
    formula="mean_b R_b; R_b = sum_k w_k r_bk over the sources that score response b (one reward model alone: its "
    "score), minus missing_eos_penalty when the response has no stop token",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    aliases=("env/reward_mean", "ppo/mean_scores"),
    importance="crucial",
    watch="Rises with training; compare with rollout/task_success to spot over-optimisation of the reward model.",
    vs_trl="In the per-token rewards the score sits on the last real response token (the stop token), not on "
    "the first padding position after it as in TRL (#3750); the logged mean is the same.",
)
OBJECTIVE_NON_SCORE_REWARD = Metric(
    name="objective/non_score_reward",
    meaning="KL-penalty part of the reward per response; a reward, so usually at or below zero.",
    formula="mean_b sum_t m_bt * (-kl_coef * kl_bt) = -kl_coef * objective/kl",
    unit="reward/sequence",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/mean_non_score_reward",),
    importance="crucial",
    watch="Drifts below zero as the policy leaves the reference; a steep fall means the KL budget is being spent fast.",
    vs_trl="Same value as TRL's code; TRL's docs write it as beta * kl.sum(1), dropping the sign.",
)
OBJECTIVE_KL = Metric(
    name="objective/kl",
    meaning="KL divergence of the sampling policy from the frozen reference, summed over each response.",
    formula="mean_b sum_t m_bt * kl_bt, kl_bt by kl_estimator (k1 default, k3 optional), computed at rollout",
    unit="nats/sequence",
    reduction="mean",
    trainers=PPO,
    importance="crucial",
    watch="Should stay positive and moderate; negative values (k1) or fast growth mean the policy is escaping "
    "the reference.",
    aliases=("objective/kl",),  # the older trainer logged it under the same name
)
OBJECTIVE_ENTROPY = Metric(
    name="objective/entropy",
    meaning="Sampled estimate of the policy's entropy per response: negative log-probability of each response.",
    formula="mean_b sum_t m_bt * (-logp_bt)",
    unit="nats/sequence",
    reduction="mean",
    trainers=PPO,
    vs_trl="TRL lets padding positions contribute their +1 log-prob sentinel (-1 each), biasing it down and "
    "even below zero (#2022); we sum real response tokens only.",
    aliases=("objective/entropy",),  # the older trainer logged it under the same name
)
OBJECTIVE_SCORES_STD = Metric(
    name="objective/scores_std",
    meaning="Spread of the scores across the sampled responses.",
    formula="sqrt of the unbiased variance of R_b over all responses of the update (all processes)",
    unit="reward",
    reduction="std",
    trainers=PPO,
    aliases=("env/reward_std", "ppo/std_scores"),
)
OBJECTIVE_KL_COEF = Metric(
    name="objective/kl_coef",
    meaning="KL penalty coefficient (beta) used for the logged update, fixed or set by the adaptive controller.",
    formula="kl_coef when kl_target is unset; otherwise after each update beta <- beta * (1 + clip(KL_u / "
    "kl_target - 1, -0.2, 0.2) * n_episodes / kl_horizon) (Ziegler et al. 2019), KL_u = that update's own "
    "objective/kl (not pooled over the logging window)",
    unit="reward/nat",
    reduction="last",
    trainers=PPO,
    importance="stability",
    watch="With the adaptive controller a steady climb often comes before numerical trouble.",
    vs_trl="TRL's current PPO has a fixed coefficient and does not log it.",
    aliases=("objective/kl_coef",),  # the older trainer logged it under the same name
)

# The PPO optimisation (pooled over every micro-batch, mini-batch, PPO epoch and process of the update)
POLICY_APPROXKL_AVG = Metric(
    name="policy/approxkl_avg",
    meaning="How far the optimisation moved the policy from the rollout policy: k2 estimate of KL per token.",
    formula="pooled token mean of 0.5 * (logp_new - logp_old)^2",
    unit="nats/token",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/policy/approxkl",),
    importance="stability",
    watch="Small; high together with high policy/clipfrac_avg means the updates are too large.",
    vs_trl="TRL averages over all padded positions (padding adds 0 to the sum but counts in the denominator) and "
    "then averages per-micro-batch means; we pool over real response tokens.",
)
POLICY_POLICYKL_AVG = Metric(
    name="policy/policykl_avg",
    meaning="k1 estimate of the KL per token between rollout and current policy during optimisation.",
    formula="pooled token mean of (logp_old - logp_new)",
    unit="nats/token",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/policy/policykl",),
)
POLICY_CLIPFRAC_AVG = Metric(
    name="policy/clipfrac_avg",
    meaning="Share of response tokens where the clipped term is the active one in PPO's surrogate loss.",
    formula="pooled token mean of 1[-A_bt * clip(r_bt, 1 - cliprange, 1 + cliprange) > -A_bt * r_bt]",
    unit="fraction",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/policy/clipfrac",),
    importance="stability",
    watch="A large share means the updates keep pushing against the trust region.",
)
POLICY_ENTROPY_AVG = Metric(
    name="policy/entropy_avg",
    meaning="Exact entropy of the current policy's next-token distribution on response tokens.",
    formula="pooled token mean of logsumexp(z_bt) - sum_v softmax(z_bt)_v * z_btv, z = logits / temperature",
    unit="nats/token",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/policy/entropy",),
    vs_trl="TRL averages over every position, padding included; we average over real response tokens.",
)
POLICY_ADVANTAGES_MEAN = Metric(
    name="policy/advantages_mean",
    meaning="Mean GAE advantage on response tokens, before whitening.",
    formula="pooled token mean of A_bt (GAE with gamma and lam, computed at rollout)",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/policy/advantages_mean",),
)
LOSS_POLICY_AVG = Metric(
    name="loss/policy_avg",
    meaning="Clipped surrogate policy loss.",
    formula="pooled token mean of max(-A_bt * r_bt, -A_bt * clip(r_bt, 1 - cliprange, 1 + cliprange)), A = "
    "whitened advantages",
    unit="dimensionless",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/loss/policy",),
    vs_trl="TRL averages per-micro-batch means; we weight every real response token equally.",
)
LOSS_VALUE_AVG = Metric(
    name="loss/value_avg",
    meaning="Clipped value-function loss, without the vf_coef factor.",
    formula="0.5 * pooled token mean of max((V_new - G)^2, (clip(V_new, V_bt - cliprange_value, V_bt + "
    "cliprange_value) - G)^2)",
    unit="reward^2",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/loss/value",),
    importance="stability",
    watch="Spikes or NaN when training goes wrong.",
    vs_trl="TRL's mask includes one position past the last response token; we use real response tokens only.",
)
LOSS_TOTAL_AVG = Metric(
    name="loss/total_avg",
    meaning="The loss the optimizer minimises: policy loss plus weighted value loss.",
    formula="loss/policy_avg + vf_coef * loss/value_avg (pooled token mean of the per-token sum)",
    unit="dimensionless",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/loss/total",),
)
VAL_CLIPFRAC_AVG = Metric(
    name="val/clipfrac_avg",
    meaning="Share of response tokens where the clipped value error is the larger (active) term.",
    formula="pooled token mean of 1[(clip(V_new, V_bt - cliprange_value, V_bt + cliprange_value) - G)^2 > "
    "(V_new - G)^2]",
    unit="fraction",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/val/clipfrac",),
    vs_trl="Same mask difference as loss/value_avg.",
)
VAL_RATIO = Metric(
    name="val/ratio",
    meaning="Mean probability ratio between current and rollout policy on response tokens.",
    formula="pooled token mean of r_bt = exp(logp_new - logp_old); exactly 1 on the first minibatch of the first "
    "PPO epoch",
    unit="dimensionless",
    reduction="mean",
    trainers=PPO,
    importance="stability",
    watch="Should stay close to 1.0; values like 2 or 1000 (or 0.1) mean consecutive policies differ too much.",
    vs_trl="TRL's unmasked mean counts each padding position as exactly 1, pulling the value toward 1.",
)
VAL_RATIO_VAR = Metric(
    name="val/ratio_var",
    meaning="Variance of the probability ratio across response tokens.",
    formula="pooled unbiased variance of r_bt over all real response tokens of the update: (sum r^2 - (sum r)^2 / "
    "n) / (n - 1)",
    unit="dimensionless",
    reduction="var",
    trainers=PPO,
    vs_trl="TRL reports the variance of the per-micro-batch mean ratios; ours is the token-level variance.",
)
VAL_NUM_EOS_TOKENS = Metric(
    name="val/num_eos_tokens",
    meaning="Number of sampled responses that contain the stop token, i.e. finished before the length limit.",
    formula="sum over processes and responses of 1[stop token in the truncated response]",
    unit="count",
    reduction="sum",
    trainers=PPO,
    vs_trl="TRL counts EOS tokens in the raw responses of the main process only (padding too when pad == eos); "
    "we count responses, summed over all processes.",
)

VAL_VPRED = Metric(
    name="val/vpred",
    meaning="Mean value prediction on response tokens during optimisation (the value model as it trains).",
    formula="pooled token mean of V_new over every micro-batch, mini-batch and PPO epoch of the update",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/val/vpred",),
)

# The value model and GAE (measured at rollout)
VAL_MEAN = Metric(
    name="val/mean",
    meaning="Mean value prediction on response tokens at rollout.",
    formula="pooled token mean of V_bt",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/val/mean",),
)
VAL_VAR = Metric(
    name="val/var",
    meaning="Variance of the value predictions on response tokens at rollout.",
    formula="pooled unbiased variance of V_bt over real response tokens",
    unit="reward^2",
    reduction="var",
    trainers=PPO,
    aliases=("ppo/val/var",),
)
VAL_VAR_EXPLAINED = Metric(
    name="val/var_explained",
    meaning="Share of the return variance the value model explains: 1 is perfect, 0 or below is useless.",
    formula="1 - Var[G_bt - V_bt] / Var[G_bt] over the real response tokens of each process's rollout batch (0 when "
    "Var[G] = 0), averaged over processes",
    unit="dimensionless",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/val/var_explained",),
)
VAL_ERROR = Metric(
    name="val/error",
    meaning="Mean squared error of the rollout value predictions against the GAE returns.",
    formula="pooled token mean of (V_bt - G_bt)^2",
    unit="reward^2",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/val/error",),
)
RETURNS_MEAN = Metric(
    name="returns/mean",
    meaning="Mean GAE return (the value targets) on response tokens.",
    formula="pooled token mean of G_bt = A_bt + V_bt",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    aliases=("ppo/returns/mean",),
)
RETURNS_VAR = Metric(
    name="returns/var",
    meaning="Variance of the GAE returns on response tokens.",
    formula="pooled unbiased variance of G_bt over real response tokens",
    unit="reward^2",
    reduction="var",
    trainers=PPO,
    aliases=("ppo/returns/var",),
)

# Lengths
TOKENS_QUERIES_LEN_MEAN = Metric(
    name="tokens/queries_len_mean",
    meaning="Mean prompt length.",
    formula="mean_b (number of non-padding query tokens)",
    unit="tokens",
    reduction="mean",
    trainers=PPO,
    aliases=("tokens/queries_len_mean",),  # the older trainer logged it under the same name
)
TOKENS_QUERIES_LEN_STD = Metric(
    name="tokens/queries_len_std",
    meaning="Spread of the prompt lengths.",
    formula="sqrt of the unbiased variance over responses of the non-padding query token count",
    unit="tokens",
    reduction="std",
    trainers=PPO,
    aliases=("tokens/queries_len_std",),  # the older trainer logged it under the same name
)
TOKENS_RESPONSES_LEN_MEAN = Metric(
    name="tokens/responses_len_mean",
    meaning="Mean response length after truncation at the stop token; with tools, the policy's own tokens (the "
    "tools' results left out, tools/mean_tool_tokens).",
    formula="mean_b sum_t m_bt (stop token included; m: the policy's tokens)",
    unit="tokens",
    reduction="mean",
    trainers=PPO,
    aliases=("tokens/responses_len_mean",),  # the older trainer logged it under the same name
)
TOKENS_RESPONSES_LEN_STD = Metric(
    name="tokens/responses_len_std",
    meaning="Spread of the response lengths.",
    formula="sqrt of the unbiased variance over responses of sum_t m_bt",
    unit="tokens",
    reduction="std",
    trainers=PPO,
    aliases=("tokens/responses_len_std",),  # the older trainer logged it under the same name
)

# True task success (independent of the reward model)
ROLLOUT_TASK_SUCCESS = Metric(
    name="rollout/task_success",
    meaning="Share of this update's sampled responses that pass the task's own correctness check.",
    formula="mean_b 1[task.check(prompt_b, response_b)]",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    when="the task has a checker",
    importance="crucial",
    watch="The ground truth beside objective/scores: if the score rises while this falls, the policy is "
    "over-optimising the reward model.",
)
EVAL_TASK_SUCCESS = Metric(
    name="eval/task_success",
    meaning="Share of evaluation prompts whose greedy completion passes the task's correctness check (GRPO with "
    "--num_generations_eval: share of the sampled completions).",
    formula="mean over eval prompts of 1[task.check(prompt, greedy completion)]; GRPO with num_generations_eval N: "
    "mean over the N sampled completions of each eval prompt",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    when="the task has a checker and an eval dataset is given; at evaluation steps (--eval_strategy; by default num_sample_generations times)",
    importance="crucial",
    watch="Should rise over training; the least noisy view of what the policy has learned.",
)

EVAL_SCORES = Metric(
    name="eval/scores",
    meaning="Mean score of the greedy completions of the evaluation prompts (same scoring and EOS trick as training).",
    formula="mean over eval prompts of R(prompt, greedy completion)",
    unit="reward",
    reduction="mean",
    trainers=PPO,
    when="an eval dataset is given; at evaluation steps (--eval_strategy; by default num_sample_generations times)",
)

# Wall time
TIME_ROLLOUT = Metric(
    name="time/rollout",
    meaning="Wall-clock seconds per step spent on rollouts: generation, scoring and the no-gradient forward passes.",
    formula="PPO: generation, policy/reference/value forwards and reward-model scores; GRPO: generation, rewards, "
    "reference and old log-prob forwards (0 on steps that reuse a batch); mean over the steps of the logging window "
    "and the processes",
    unit="s",
    reduction="mean",
    trainers=BOTH,
)
TIME_OPTIMIZATION = Metric(
    name="time/optimization",
    meaning="Wall-clock seconds per step spent on optimisation (forward, backward and optimizer steps).",
    formula="seconds of the forward/backward passes and optimizer steps of a step; mean over the steps of the logging "
    "window and the processes",
    unit="s",
    reduction="mean",
    trainers=BOTH,
)

# Speed and memory of the hardware (rlhfkit/perf.py). n_b: real (non-padding) prompt and completion tokens of sequence
# b in a training forward; F(c) = perf.forward_flops_per_token(trained model, c) = 2 x matmul weights + 4 x layers x
# heads x head_dim x c.
_PERFORMANCE = "Performance"
_TRAINED = (
    "summed over every training forward of the window (each micro-batch of every PPO epoch or GRPO iteration), "
    "PPO's policy and value model both"
)
PERF_MFU = Metric(
    name="perf/mfu",
    meaning="Model FLOPs utilisation of the optimisation phase: the share of the devices' peak FLOP/s that the "
    "training forwards and backwards used (TRL's async trainer: perf/mfu_fwd_bwd).",
    formula=f"sum_p FLOPs_p / (sum_p seconds_p x peak); FLOPs = 3 x sum_b n_b x F((n_b + 1) / 2) {_TRAINED}, "
    "backward = 2 x forward; seconds as time/optimization, p the processes (so FLOPs / (seconds x peak x processes)); "
    "peak = perf.device_peak_flops: the dense bf16/fp16 peak of the card (H100 SXM 989e12, ...) or "
    "RLHFKIT_PEAK_TFLOPS x 1e12",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section=_PERFORMANCE,
    when="the peak is known: an NVIDIA card of perf.PEAK_FLOPS computing in bf16 or fp16 (--bf16, --fp16 or half "
    "weights), or RLHFKIT_PEAK_TFLOPS set; not on CPUs without it",
    watch="Model FLOPs, as PaLM counts them: recomputation (gradient checkpointing, the chunked LM head's backward) "
    "is not counted, and the LM head counts at every token though it runs only on completion tokens; with LoRA the "
    "frozen weights take no weight gradient, so the backward needs less than counted. 0.3-0.5 is good for dense "
    "pre-training; RL's small micro-batches and padding give less. Low: the phase waits on something other than "
    "matrix multiplies (small micro-batches, optimizer steps, communication, the CPU); raise "
    "per_device_train_batch_size.",
)
PERF_TRAINING_TOKENS_PER_S = Metric(
    name="perf/training_tokens_per_s",
    meaning="Tokens per second of the optimisation phase on each device: the real prompt and completion tokens the "
    "training forwards ran.",
    formula=f"sum_p sum_b n_b / sum_p seconds_p, n_b {_TRAINED}; seconds as time/optimization (so a per-process "
    "rate: times the number of processes for the run's)",
    unit="tokens/s",
    reduction="mean",
    trainers=BOTH,
    section=_PERFORMANCE,
    watch="perf/mfu's numerator in tokens; it counts a token once per forward (num_ppo_epochs or num_iterations "
    "times).",
)
_PHASE_MEMORY_WHEN = (
    "on CUDA unless RLHFKIT_PHASE_MEMORY=0; on CPUs (Linux) only with RLHFKIT_PHASE_MEMORY=1, because resetting the "
    "process's peak RSS also resets what /usr/bin/time and getrusage report as its maximum"
)
_PHASE_MEMORY_FORMULA = (
    "max over the window's steps and processes of the peak since the phase's start, / 1e9: CUDA "
    "torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats; CPU VmHWM of /proc/self/status after "
    "writing 5 to /proc/self/clear_refs"
)
PERF_PEAK_MEMORY_ROLLOUT = Metric(
    name="perf/peak_memory_gb/rollout",
    meaning="Peak memory of the rollout phase (time/rollout's: generation, scoring, reference and old log-prob "
    "forwards): tensors allocated on the GPU, or the process's resident memory on a CPU.",
    formula=_PHASE_MEMORY_FORMULA,
    unit="GB",
    reduction="max",
    trainers=BOTH,
    section=_PERFORMANCE,
    when=_PHASE_MEMORY_WHEN,
    watch="Near the card's memory: the KV cache of a generation grows with the completions sampled at once and "
    "their length: lower GRPO's generation_batch_size (steps_per_generation) or PPO's "
    "local_rollout_forward_batch_size, or the completion length.",
)
PERF_PEAK_MEMORY_OPTIMIZATION = Metric(
    name="perf/peak_memory_gb/optimization",
    meaning="Peak memory of the optimisation phase (time/optimization's: training forwards, backwards and optimizer "
    "steps): tensors allocated on the GPU, or the process's resident memory on a CPU.",
    formula=_PHASE_MEMORY_FORMULA,
    unit="GB",
    reduction="max",
    trainers=BOTH,
    section=_PERFORMANCE,
    when=_PHASE_MEMORY_WHEN,
    watch="Near the card's memory: lower per_device_train_batch_size (raise gradient_accumulation_steps to keep the "
    "batch) or turn on --gradient_checkpointing.",
)

# ----------------------------------------------------------------------------------------------
# PPO histograms, one per logging window (raw values from all processes and every update of the window)
# ----------------------------------------------------------------------------------------------

ENV_REWARD_DIST = Metric(
    name="env/reward_dist",
    meaning="Distribution of the scores of the sampled responses.",
    formula="{R_b} over all responses of the update",
    unit="reward",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("env/reward_dist",),  # the older trainer logged it under the same name
)
OBJECTIVE_KL_DIST = Metric(
    name="objective/kl_dist",
    meaning="Distribution over responses of the summed KL to the reference.",
    formula="{sum_t m_bt * kl_bt} over all responses",
    unit="nats/sequence",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("objective/kl_dist",),  # the older trainer logged it under the same name
)
OBJECTIVE_LOGPROBS = Metric(
    name="objective/logprobs",
    meaning="Distribution of the sampled tokens' log-probabilities under the sampling policy.",
    formula="{logp_bt : m_bt}",
    unit="nats/token",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("objective/logprobs",),  # the older trainer logged it under the same name
)
OBJECTIVE_REF_LOGPROBS = Metric(
    name="objective/ref_logprobs",
    meaning="Distribution of the sampled tokens' log-probabilities under the reference model.",
    formula="{ref_bt : m_bt}",
    unit="nats/token",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("objective/ref_logprobs",),  # the older trainer logged it under the same name
)
POLICY_RATIO_DIST = Metric(
    name="policy/ratio_dist",
    meaning="Distribution of the per-token probability ratio over all minibatches and epochs of the update.",
    formula="{r_bt : m_bt}",
    unit="dimensionless",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("ppo/policy/ratio",),
)
POLICY_ADVANTAGES_DIST = Metric(
    name="policy/advantages_dist",
    meaning="Distribution of the whitened per-token advantages used in the policy loss.",
    formula="{whiten(A)_bt : m_bt}",
    unit="dimensionless",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("ppo/policy/advantages",),
)
TOKENS_QUERIES_DIST = Metric(
    name="tokens/queries_dist",
    meaning="Distribution of prompt lengths.",
    formula="{number of non-padding query tokens of b}",
    unit="tokens",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("tokens/queries_dist",),  # the older trainer logged it under the same name
)
TOKENS_RESPONSES_DIST = Metric(
    name="tokens/responses_dist",
    meaning="Distribution of response lengths after truncation at the stop token.",
    formula="{sum_t m_bt}",
    unit="tokens",
    reduction="histogram",
    trainers=PPO,
    kind="histogram",
    aliases=("tokens/responses_dist",),  # the older trainer logged it under the same name
)


# ----------------------------------------------------------------------------------------------
# GRPO scalars, once per logging window of `logging_steps` optimizer steps (step = optimizer step)
# Notation: i indexes completions, k reward functions; r_ik raw reward, w_k its weight, R_i = sum_k w_k r_ik;
# groups of G = num_generations completions share a prompt; l_i completion length in tokens (EOS included); with
# tools, the policy's own tokens of the episode only (tool results left out, as TRL counts them).
# ----------------------------------------------------------------------------------------------

NUM_TOKENS = Metric(
    name="num_tokens",
    meaning="Prompt and completion tokens processed so far, all processes.",
    formula="sum over generated batches so far of the real (non-padding) prompt and completion tokens",
    unit="tokens",
    reduction="last",
    trainers=GRPO,
    section="Run progress",
)
LOSS = Metric(
    name="loss",
    meaning="The loss the optimizer minimised, as aggregated by loss_type (plus beta * KL when beta > 0, minus the "
    "entropy bonus when entropy_coef != 0 or use_adaptive_entropy).",
    formula="mean over the window's optimizer steps and processes of the step's loss (sum of its micro-batch losses)",
    unit="dimensionless",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    watch="Near 0 is expected with num_iterations = 1 and beta = 0 (the ratio is 1 and advantages are centred); "
    "watch reward instead.",
)
POLICY_LOSS = Metric(
    name="policy_loss",
    meaning="The loss without the entropy bonus: the policy term as aggregated by loss_type, plus beta * KL (TRL "
    "1.16's name). loss = policy_loss - entropy_coef * mean entropy.",
    formula="mean over the window's optimizer steps and processes of the step's loss before the entropy bonus is "
    "subtracted",
    unit="dimensionless",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="entropy_coef != 0 or use_adaptive_entropy",
    watch="Read it beside loss: the gap is the bonus; a loss falling while policy_loss stays is entropy, not reward.",
)
AUX_LOSS = Metric(
    name="aux_loss",
    meaning="A mixture-of-experts policy's load-balancing loss (transformers' aux_loss of the router logits: how "
    "unevenly its routers send tokens to the experts; lowest when every expert gets its share), added to the training "
    "loss times router_aux_loss_coef (TRL 1.16's name and rule).",
    formula="mean over the window's micro-batches and processes of the training forward's aux_loss (the model "
    "family's load_balancing_loss_func over every layer's router logits and the batch's real tokens)",
    unit="dimensionless",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="the policy is a mixture of experts (its config has output_router_logits) and router_aux_loss_coef != 0",
    watch="Rising while the reward rises: the experts are collapsing onto a few; raise router_aux_loss_coef.",
)
COMPLETIONS_MEAN_LENGTH = Metric(
    name="completions/mean_length",
    meaning="Mean completion length, truncated completions included.",
    formula="mean_i l_i",
    unit="tokens",
    reduction="mean",
    trainers=GRPO,
)
COMPLETIONS_MIN_LENGTH = Metric(
    name="completions/min_length",
    meaning="Shortest completion.",
    formula="min_i l_i",
    unit="tokens",
    reduction="min",
    trainers=GRPO,
)
COMPLETIONS_MAX_LENGTH = Metric(
    name="completions/max_length",
    meaning="Longest completion.",
    formula="max_i l_i",
    unit="tokens",
    reduction="max",
    trainers=GRPO,
)
COMPLETIONS_CLIPPED_RATIO = Metric(
    name="completions/clipped_ratio",
    meaning="Share of completions cut off at max_completion_length without a terminator.",
    formula="mean_i 1[completion i contains no EOS id of the tokenizer or generation config]",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    importance="stability",
    watch="High means completions are cut off: raise max_completion_length or teach the model to stop.",
    vs_trl="TRL counts only tokenizer.eos_token_id as a terminator (#7039); we honour every EOS id.",
)
COMPLETIONS_MEAN_TERMINATED_LENGTH = Metric(
    name="completions/mean_terminated_length",
    meaning="Mean length of the completions that ended with a terminator.",
    formula="mean of l_i over terminated completions (0 when none)",
    unit="tokens",
    reduction="mean",
    trainers=GRPO,
)
COMPLETIONS_MIN_TERMINATED_LENGTH = Metric(
    name="completions/min_terminated_length",
    meaning="Shortest completion that ended with a terminator.",
    formula="min of l_i over terminated completions (0 when none)",
    unit="tokens",
    reduction="min",
    trainers=GRPO,
)
COMPLETIONS_MAX_TERMINATED_LENGTH = Metric(
    name="completions/max_terminated_length",
    meaning="Longest completion that ended with a terminator.",
    formula="max of l_i over terminated completions (0 when none)",
    unit="tokens",
    reduction="max",
    trainers=GRPO,
)
REWARDS_FUNC_MEAN = Metric(
    name="rewards/{reward_func_name}/mean",
    meaning="Mean raw (unweighted) reward of one reward function or reward model.",
    formula="mean_i r_ik over completions where function k returned a value (None = not applicable, left out)",
    unit="reward",
    reduction="mean",
    trainers=BOTH,
    when="once per reward function and reward model, named after it; PPO: only with --reward_funcs (a reward model "
    "alone is objective/scores)",
    importance="crucial",
    watch="Shows which part of the desired behaviour is being learned when several rewards are combined.",
)
REWARDS_FUNC_STD = Metric(
    name="rewards/{reward_func_name}/std",
    meaning="Spread of one reward function's raw rewards.",
    formula="sqrt of the unbiased variance of r_ik over completions where function k returned a value",
    unit="reward",
    reduction="std",
    trainers=BOTH,
    when="once per reward function and reward model, named after it; PPO: only with --reward_funcs",
)
REWARD = Metric(
    name="reward",
    meaning="Mean total reward: the weighted sum of the reward functions, before group normalisation.",
    formula="mean_i R_i, R_i = sum over applicable k of w_k * r_ik",
    unit="reward",
    reduction="mean",
    trainers=GRPO,
    section="Rewards",
    importance="crucial",
    watch="The primary objective: it should rise while training works.",
    vs_trl="TRL's docs call it normalised; like TRL's code (since #5353) we log the weighted reward before the "
    "advantages are computed.",
)
REWARD_STD = Metric(
    name="reward_std",
    meaning="Spread of the total reward over all completions of the batch.",
    formula="sqrt of the unbiased variance of R_i over all completions (batch level, not per group)",
    unit="reward",
    reduction="std",
    trainers=GRPO,
    section="Rewards",
)
FRAC_REWARD_ZERO_STD = Metric(
    name="frac_reward_zero_std",
    meaning="Share of completions whose group got identical rewards, so they carry no learning signal.",
    formula="mean_i 1[std of R over the G completions of i's group == 0]",
    unit="fraction",
    reduction="mean",
    trainers=GRPO,
    section="Rewards",
    importance="stability",
    watch="Near 1 means almost every group is all-right or all-wrong: no gradient. Make prompts harder/easier "
    "or raise num_generations.",
    vs_trl="With dynamic_sampling, over every group generated, those dropped included (the share dynamic sampling "
    "acts on); the batch trained on then has none, or only the ones filled in at the cap. With "
    "multi_objective_aggregation normalize_then_sum still each group's spread of R; TRL logs there whether the "
    "std of the whole batch's aggregated rewards is 0 (0 or 1 for every completion).",
)
_PER_GENERATION = "mean over the window's generation batches"
DYNAMIC_SAMPLING_EXTRA_ROUNDS = Metric(
    name="dynamic_sampling/extra_rounds",
    meaning="Generation rounds beyond the first that dynamic sampling needed to fill a generation batch.",
    formula=f"{_PER_GENERATION} of (rounds - 1); a round generates G completions for a generation batch of prompts",
    unit="rounds",
    reduction="mean",
    trainers=GRPO,
    section="Dynamic sampling",
    when="dynamic_sampling",
    watch="Each round costs a full generation. Near max_num_gen_batches - 1: most groups have no spread (see "
    "frac_reward_zero_std); the prompts are too easy or too hard for the policy.",
)
DYNAMIC_SAMPLING_ZERO_STD_GROUPS_DROPPED = Metric(
    name="dynamic_sampling/zero_std_groups_dropped",
    meaning="Groups without reward spread that dynamic sampling left out of a generation batch.",
    formula=f"{_PER_GENERATION} of the count of generated groups with std R == 0 (as frac_reward_zero_std) that are "
    "not in the batch",
    unit="groups",
    reduction="mean",
    trainers=GRPO,
    section="Dynamic sampling",
    when="dynamic_sampling",
)
DYNAMIC_SAMPLING_ZERO_STD_GROUPS_FILLED = Metric(
    name="dynamic_sampling/zero_std_groups_filled",
    meaning="Slots of a generation batch filled with groups without reward spread because the rounds hit the cap.",
    formula=f"{_PER_GENERATION} of the count of zero-spread groups kept after max_num_gen_batches rounds found too "
    "few groups with spread (0 otherwise)",
    unit="groups",
    reduction="mean",
    trainers=GRPO,
    section="Dynamic sampling",
    when="dynamic_sampling",
    importance="stability",
    watch="Above 0: even max_num_gen_batches rounds could not fill the batch with learning signal; the filled "
    "groups add no gradient. Raise max_num_gen_batches (0: no cap) or change the prompts.",
)
_TOOLS = "tools (GRPOTrainer or PPOTrainer(tools=[...]))"
_TOOLS_WINDOW = "over the window's episodes, all processes"
TOOLS_CALL_FREQUENCY = Metric(
    name="tools/call_frequency",
    meaning="Tool calls per episode (completion): how often the policy uses its tools.",
    formula=f"(tool calls made) / (episodes), {_TOOLS_WINDOW}; every parsed call counts, failed or unknown ones "
    "included, and calls whose results were rolled back at the length limit",
    unit="calls/episode",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
    importance="crucial",
    watch="0 for long while the task needs a tool: the policy never learned the call format (check the chat "
    "template and response_template, or warm-start with SFT on calls).",
    vs_trl="TRL averages each generation's ratio over the window; we pool calls and episodes before dividing.",
)
TOOLS_FAILURE_FREQUENCY = Metric(
    name="tools/failure_frequency",
    meaning="Share of tool calls that failed: the tool raised, timed out, was unknown or got wrong arguments.",
    formula=f"(failed calls) / (tool calls), {_TOOLS_WINDOW}; 0 when no call was made",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
    importance="stability",
    watch="High: the tools' errors go into the conversations; look at tools/{tool_name}/failure_frequency for which "
    "tool, and at the completions table for the calls.",
    vs_trl="TRL averages each generation's ratio over the window; we pool failures and calls before dividing.",
)
TOOLS_MEAN_TURNS = Metric(
    name="tools/mean_turns",
    meaning="The policy's turns per episode: 1 + the turns it took after tool results.",
    formula=f"mean of the assistant turns of each episode, {_TOOLS_WINDOW}",
    unit="turns",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
    watch="Near max_tool_calling_iterations + 1: most episodes run to the turn cap.",
)
TOOLS_MAX_TURNS = Metric(
    name="tools/max_turns",
    meaning="Most turns of an episode.",
    formula=f"max of the assistant turns of each episode, {_TOOLS_WINDOW}",
    unit="turns",
    reduction="max",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
)
TOOLS_TURN_CAP_RATIO = Metric(
    name="tools/turn_cap_ratio",
    meaning="Share of episodes ended by max_tool_calling_iterations with their last turn's tool calls unanswered.",
    formula=f"mean of 1[the episode's last turn called a tool after max_tool_calling_iterations rounds of results], "
    f"{_TOOLS_WINDOW}",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
    importance="stability",
    watch="High: most episodes run to the turn cap; the policy loops on its tools, or the cap is too low for the task.",
)
TOOLS_ROLLED_BACK_RATIO = Metric(
    name="tools/rolled_back_ratio",
    meaning="Share of episodes ended with a tool call pending because its results did not fit max_completion_length "
    "(PPO: response_length).",
    formula=f"mean of 1[the results of the episode's last calls would have pushed the completion past "
    f"max_completion_length, PPO's response_length (or the sequence to max_position_embeddings) and were dropped], "
    f"{_TOOLS_WINDOW}",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
    watch="High: the tools' results are too long for the completion budget; raise max_completion_length (PPO: "
    "response_length) or shorten the results.",
)
TOOLS_MEAN_TOOL_TOKENS = Metric(
    name="tools/mean_tool_tokens",
    meaning="Tokens per episode that came from tools (the chat template's rendering of their results), not the policy.",
    formula=f"mean over episodes of the completion tokens outside the policy's turns, {_TOOLS_WINDOW}; the policy's "
    "own tokens are completions/mean_length (PPO: tokens/responses_len_mean)",
    unit="tokens",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when=_TOOLS,
)
TOOLS_TOOL_CALLS = Metric(
    name="tools/{tool_name}/calls",
    meaning="Calls of one tool per episode.",
    formula=f"(calls naming this tool) / (episodes), {_TOOLS_WINDOW}",
    unit="calls/episode",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when="once per tool, named after its function; tools",
)
TOOLS_TOOL_FAILURE_FREQUENCY = Metric(
    name="tools/{tool_name}/failure_frequency",
    meaning="Share of one tool's calls that failed (it raised, timed out or got wrong arguments).",
    formula=f"(failed calls of this tool) / (calls of this tool), {_TOOLS_WINDOW}; 0 when it was not called",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when="once per tool, named after its function; tools",
    importance="stability",
    watch="Near 1: this tool fails most calls; the completions table shows the calls and the errors.",
)
TOOLS_TOOL_LATENCY = Metric(
    name="tools/{tool_name}/latency_s",
    meaning="Mean wall-clock seconds of one tool's calls.",
    formula=f"(seconds spent in this tool's calls) / (calls of this tool), {_TOOLS_WINDOW}; 0 when it was not "
    "called; a timed-out call counts the timeout",
    unit="s",
    reduction="mean",
    trainers=BOTH,
    section="Tools",
    when="once per tool, named after its function; tools",
    watch="A round's calls run together, every episode's (sync ones in threads, async ones awaited together): a "
    "slow tool costs a round one latency, in the generation's time.",
)


def _evaluated(metric: Metric, of: str, window: str, over: str) -> Metric:
    """The same metric of an evaluation's `of` (eval/..., at evaluation steps), the `window` of its formula read
    `over` the evaluation's."""
    return replace(
        metric,
        name=f"eval/{metric.name}",
        meaning=f"{metric.meaning} Of an evaluation's {of}.",
        formula=metric.formula.replace(window, over),
        when=f"{metric.when}; an eval dataset; at evaluation steps",
        importance="",
        watch="",
        vs_trl="",
        section="Evaluation",
    )


def _tools_evaluated(metric: Metric) -> Metric:
    """The same tool metric of an evaluation's episodes (eval/tools/...)."""
    episodes = "episodes (greedy, the tools run as in training)"
    return _evaluated(metric, episodes, _TOOLS_WINDOW, "over the evaluation's episodes, all processes")


# The tools metrics of an evaluation: the training ones' twins (agents.episodes.log_tool_stats(evaluation=True)).
EVAL_TOOLS_CALL_FREQUENCY = _tools_evaluated(TOOLS_CALL_FREQUENCY)
EVAL_TOOLS_FAILURE_FREQUENCY = _tools_evaluated(TOOLS_FAILURE_FREQUENCY)
EVAL_TOOLS_MEAN_TURNS = _tools_evaluated(TOOLS_MEAN_TURNS)
EVAL_TOOLS_MAX_TURNS = _tools_evaluated(TOOLS_MAX_TURNS)
EVAL_TOOLS_TURN_CAP_RATIO = _tools_evaluated(TOOLS_TURN_CAP_RATIO)
EVAL_TOOLS_ROLLED_BACK_RATIO = _tools_evaluated(TOOLS_ROLLED_BACK_RATIO)
EVAL_TOOLS_MEAN_TOOL_TOKENS = _tools_evaluated(TOOLS_MEAN_TOOL_TOKENS)
EVAL_TOOLS_TOOL_CALLS = _tools_evaluated(TOOLS_TOOL_CALLS)
EVAL_TOOLS_TOOL_FAILURE_FREQUENCY = _tools_evaluated(TOOLS_TOOL_FAILURE_FREQUENCY)
EVAL_TOOLS_TOOL_LATENCY = _tools_evaluated(TOOLS_TOOL_LATENCY)

_ASYNC = "async_generation"
_PER_ROUND = "over the window's generations"
ASYNC_STALENESS_MEAN = Metric(
    name="sample/staleness_mean",
    meaning="How many optimizer steps older than the trainer's weights the generations trained on were.",
    formula=f"mean {_PER_ROUND} of (optimizer steps taken) - (steps behind the weights that sampled it)",
    unit="steps",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    watch="max_staleness once the pipeline is full (0 at the first steps and after a resume).",
)
ASYNC_STALENESS_MAX = Metric(
    name="sample/staleness_max",
    meaning="The oldest generation trained on in the window, in optimizer steps behind the trainer's weights.",
    formula=f"max {_PER_ROUND} of the staleness",
    unit="steps",
    reduction="max",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    watch="Never above max_staleness: the trainer asks for at most max_staleness generations ahead.",
)
ASYNC_QUEUE_SIZE = Metric(
    name="sample/rollout_queue_size",
    meaning="Generations finished and waiting when the trainer took one (the one it took included).",
    formula=f"mean {_PER_ROUND} of the results ready in the worker's queue at the trainer's take",
    unit="generations",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    watch="Near 1 with perf/rollout_wait_s high: generation is the bottleneck; near max_staleness + 1: the "
    "trainer is.",
)
ASYNC_ROLLOUT_WAIT = Metric(
    name="perf/rollout_wait_s",
    meaning="Seconds per step the trainer sat waiting for the generation worker.",
    formula="mean over the window's steps and processes of the seconds between asking the queue for a generation "
    "and getting it (the first update's also holds the wait for the worker to start)",
    unit="s",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    watch="Large against time/optimization: generation is slower than optimisation, so the overlap hides only "
    "the optimisation; give the worker more threads (generation_threads) or shorter completions.",
)
ASYNC_BACKPRESSURE = Metric(
    name="rollout/backpressure_s",
    meaning="Seconds per generation the worker sat idle, waiting for the trainer to ask for the next one.",
    formula=f"mean {_PER_ROUND} of the worker's wait for the request of that generation (the staleness bound holding "
    "it back)",
    unit="s",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    watch="Large: optimisation is the bottleneck and the worker idles; give the trainer more threads.",
)
ASYNC_GENERATED_TOKENS_PER_S = Metric(
    name="rollout/generated_tokens_per_s",
    meaning="The generation worker's sampling speed.",
    formula=f"completion tokens {_PER_ROUND} / the worker's seconds sampling them (pooled over processes)",
    unit="tokens/s",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
)
ASYNC_WEIGHT_SYNC = Metric(
    name="perf/weight_sync_s",
    meaning="Seconds per step the trainer spent copying its weights out to the generation worker.",
    formula="mean over the window's steps of the time to flatten the parameters and post their send (the transfer "
    "itself runs in the background)",
    unit="s",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
)
_BEHAVIOUR = (
    "over the completion tokens of each micro-batch, with d_bt = logp_old_bt - logp_sample_bt, logp_old the "
    "trainer's log-probs at the update and logp_sample the worker's at sampling"
)
OFF_POLICY_MISMATCH_KL = Metric(
    name="off_policy/mismatch_kl",
    meaning="KL divergence of the trainer's policy from the one that sampled the batch (stale weights included).",
    formula=f"token mean of exp(d_bt) - 1 - d_bt (k3 estimate of KL(behaviour || old)) {_BEHAVIOUR}",
    unit="nats/token",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when=_ASYNC,
    importance="stability",
    watch="About 1e-6 at staleness 0 in fp32; grows with max_staleness and the learning rate (0.006 at staleness 1 "
    "and 0.1 at staleness 4 on the built-in task). Near 1 nat per token: the batches are too old for the correction "
    "to mend (health rule off_policy_mismatch); lower max_staleness or the learning rate.",
)
OFF_POLICY_IS_WEIGHT_MEAN = Metric(
    name="off_policy/importance_weight_mean",
    meaning="Mean weight the importance-sampling correction gave the tokens of stale batches.",
    formula=f"token mean of the weight (exp(d_bt), or exp of its sequence sum, truncated or masked into "
    f"[clip_min, clip_max]) over stale batches {_BEHAVIOUR}",
    unit="ratio",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when="async_generation, a stale batch and vllm_importance_sampling_correction",
)
OFF_POLICY_TRUNCATED_FRAC = Metric(
    name="off_policy/truncated_frac",
    meaning="Share of stale batches' tokens whose importance weight was truncated into [clip_min, clip_max].",
    formula=f"token mean of 1[ratio outside the bounds] in the *_truncate modes, over stale batches {_BEHAVIOUR}",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when="async_generation, a stale batch and vllm_importance_sampling_correction",
)
OFF_POLICY_MASKED_FRAC = Metric(
    name="off_policy/masked_frac",
    meaning="Share of stale batches' tokens the importance-sampling correction left out (weight 0).",
    formula=f"token mean of 1[ratio outside the bounds] in the *_mask modes, over stale batches {_BEHAVIOUR}",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Asynchronous generation",
    when="async_generation, a stale batch and vllm_importance_sampling_correction",
    watch="The share of tokens that stop training. It stays low even when a run collapses from stale batches if "
    "the ratios fall below 1 (the default sequence_mask has no lower bound): read off_policy/mismatch_kl and "
    "off_policy/importance_weight_mean first.",
)
KL = Metric(
    name="kl",
    meaning="KL divergence of the current policy from the reference, per completion token (k3 estimator).",
    formula="pooled token mean of k3 = exp(ref - logp) - (ref - logp) - 1, logp of the policy being optimised; "
    "times the importance ratio r with use_bias_correction_kl (the default, as TRL 1.16)",
    unit="nats/token",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="beta != 0",
    importance="crucial",
    watch="Should grow slowly; fast growth means the policy is leaving the reference.",
)
ENTROPY = Metric(
    name="entropy",
    meaning="Exact entropy of the policy's next-token distribution on completion tokens.",
    formula="pooled token mean of logsumexp(z) - sum_v softmax(z)_v * z_v, z = logits / temperature",
    unit="nats/token",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    importance="stability",
    watch="A fast collapse towards 0 means the policy stops exploring too early.",
)
ENTROPY_COEF = Metric(
    name="entropy_coef",
    meaning="Coefficient of the entropy bonus: entropy_coef, or the adaptive controller's value after each optimizer "
    "step.",
    formula="mean over the window's optimizer steps of c after the step; adaptive: c <- min(c + entropy_coef_delta, "
    "entropy_coef_max) if the step's token-weighted mean entropy H_w <= entropy_target, else max(c - "
    "entropy_coef_delta, entropy_coef_min); a step applies c only if the previous step's H_w <= entropy_target",
    unit="dimensionless",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="entropy_coef != 0 or use_adaptive_entropy",
    watch="Adaptive: pinned at entropy_coef_max means the bonus cannot hold the entropy at entropy_target; at "
    "entropy_coef_min, the entropy stays above it and no bonus applies.",
)
CLIP_RATIO_LOW_MEAN = Metric(
    name="clip_ratio/low_mean",
    meaning="Share of completion tokens whose ratio was clipped at the lower bound (negative advantage).",
    formula="pooled token mean of 1[r < 1 - epsilon and A < 0], r = exp(logp - logp_old)",
    unit="fraction",
    reduction="mean",
    trainers=GRPO,
    when="loss_type grpo, bnpo, dr_grpo, dapo or luspo (the clipped surrogate)",
    importance="stability",
    watch="0 with num_iterations = 1; high values mean the policy moves too far per generation.",
)
CLIP_RATIO_LOW_MIN = Metric(
    name="clip_ratio/low_min",
    meaning="Smallest lower-clip share of any micro-batch on any process in the window.",
    formula="min over micro-batches and processes of the micro-batch's token mean of 1[r < 1 - epsilon and A < 0]",
    unit="fraction",
    reduction="min",
    trainers=GRPO,
    when="loss_type grpo, bnpo, dr_grpo, dapo or luspo (the clipped surrogate)",
    vs_trl="TRL 1.16 (PR #6380) takes the min over completions of each completion's clipped token share, "
    "gathered across processes; rlhfkit keeps the definition of TRL's logging page, the min over micro-batches "
    "(and processes) of each micro-batch's share",
)
CLIP_RATIO_HIGH_MEAN = Metric(
    name="clip_ratio/high_mean",
    meaning="Share of completion tokens whose ratio was clipped at the upper bound (positive advantage).",
    formula="pooled token mean of 1[r > 1 + epsilon_high and A > 0]",
    unit="fraction",
    reduction="mean",
    trainers=GRPO,
    when="loss_type grpo, bnpo, dr_grpo, dapo or luspo (the clipped surrogate)",
)
CLIP_RATIO_HIGH_MAX = Metric(
    name="clip_ratio/high_max",
    meaning="Largest upper-clip share of any micro-batch on any process in the window.",
    formula="max over micro-batches and processes of the micro-batch's token mean of 1[r > 1 + epsilon_high and A > 0]",
    unit="fraction",
    reduction="max",
    trainers=GRPO,
    when="loss_type grpo, bnpo, dr_grpo, dapo or luspo (the clipped surrogate)",
    vs_trl="TRL 1.16 (PR #6380) takes the max over completions of each completion's clipped token share, "
    "gathered across processes; rlhfkit keeps the definition of TRL's logging page, the max over micro-batches "
    "(and processes) of each micro-batch's share",
)
CLIP_RATIO_REGION_MEAN = Metric(
    name="clip_ratio/region_mean",
    meaning="Share of completion tokens clipped at either bound.",
    formula="pooled token mean of 1[(r < 1 - epsilon and A < 0) or (r > 1 + epsilon_high and A > 0)]",
    unit="fraction",
    reduction="mean",
    trainers=GRPO,
    when="loss_type grpo, bnpo, dr_grpo, dapo or luspo (the clipped surrogate)",
    importance="stability",
    watch="High values mean updates push hard against the clip range: lower learning_rate or num_iterations.",
)
CISPO_CLIP_RATIO = Metric(
    name="cispo_clip_ratio",
    meaning="Share of completion tokens whose CISPO weight was capped (ratio above epsilon_high, positive advantage).",
    formula="pooled token mean of 1[r > epsilon_high and A > 0]",
    unit="fraction",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="loss_type cispo",
    importance="stability",
    watch="0 with one update per generation; high values mean the policy moves far from the sampler.",
)
VESPO_PHI_SEQ_MEAN = Metric(
    name="vespo/phi_seq_mean",
    meaning="Mean VESPO gamma weight of the completions: 1 on-policy, smaller as the sequence ratio drifts.",
    formula="mean over completions of phi(w) = exp(lambda + k ln w - lambda w), w = prod_t r_t (clamped)",
    unit="weight",
    reduction="mean",
    trainers=GRPO,
    section="Policy optimisation",
    when="loss_type vespo",
    importance="stability",
    watch="Near 1; a falling mean means most completions are down-weighted: fewer iterations per generation.",
)
EVAL_REWARD = Metric(
    name="eval/reward",
    meaning="Mean total reward of the greedy completions of the evaluation prompts (sampled ones with "
    "--num_generations_eval).",
    formula="mean over eval prompts of R(prompt, greedy completion); with num_generations_eval N, mean over the N "
    "completions sampled for each eval prompt",
    unit="reward",
    reduction="mean",
    trainers=GRPO,
    when="an eval dataset is given; at evaluation steps (--eval_strategy; by default num_sample_generations times)",
)
EVAL_LOSS = Metric(
    name="eval/loss",
    meaning="The training loss's formula on the evaluation completions (TRL's and transformers' eval_loss, the key "
    "metric_for_best_model reads by default): loss_type's aggregation of the clipped policy term, plus beta * KL to "
    "the reference, with advantages normalised within each eval prompt's completions and the ratio 1 (the "
    "completions were sampled by the weights scoring them). One greedy completion per prompt (the default) has "
    "advantage 0, leaving beta * KL; --num_generations_eval N gives groups of N, as training's of num_generations.",
    formula="per evaluation batch b: L_b = aggregate_{loss_type}(-A_i * rho_it + beta * KL_it over its completion "
    "tokens), rho = 1, A from the batch's groups (scale_rewards); eval_loss = sum_b n_b L_b / sum_b n_b over the "
    "batches of every process (n_b its prompts' completions)",
    unit="dimensionless",
    reduction="mean",
    trainers=GRPO,
    when="an eval dataset is given; at evaluation steps (--eval_strategy; by default num_sample_generations times)",
    watch="With greedy evaluation it is beta times the KL of the evaluation completions: compare it with "
    "eval/reward, not with the training loss, whose advantages are rarely zero.",
)

# ----------------------------------------------------------------------------------------------
# Sampling against training (both trainers): are the samples drawn from the policy the loss scores?
# ----------------------------------------------------------------------------------------------

_FRESH = (
    "over the completion tokens of the first micro-batches trained on each generation, before any optimizer step on "
    "it (PPO: the first mini-batch of the first PPO epoch; GRPO: the micro-batches of the step that generated it)"
)
SAMPLING_LOGP_DIFFERENCE_MEAN = Metric(
    name="sampling/sampling_logp_difference/mean",
    meaning="How far the training forward's log-probs are from the sampler's, per token, on the same weights.",
    formula=f"token mean of |logp_train_bt - logp_sample_bt| {_FRESH}",
    unit="nats/token",
    reduction="mean",
    trainers=BOTH,
    section="Sampling against training",
    importance="stability",
    watch="About 1e-6 in fp32 (cached decoding against a full forward), about 1e-2 in bf16. Far larger: sampling "
    "and training disagree (temperature, padding, position ids, dropout, a different model), and every ratio is off.",
    vs_trl="TRL logs it only with vLLM's importance-sampling correction; rlhfkit logs it for every run.",
)
SAMPLING_LOGP_DIFFERENCE_MAX = Metric(
    name="sampling/sampling_logp_difference/max",
    meaning="The largest per-token gap between the training forward's and the sampler's log-probs.",
    formula=f"max of |logp_train_bt - logp_sample_bt| {_FRESH}",
    unit="nats",
    reduction="max",
    trainers=BOTH,
    section="Sampling against training",
)
# The gap between the training forward's and the sampler's log-prob of a token above which it counts as mismatched.
MISMATCH_NATS = 0.1
SAMPLING_MISMATCHED_TOKENS = Metric(
    name="sampling/mismatched_tokens_frac",
    meaning=f"Share of tokens whose training log-prob differs from the sampler's by more than {MISMATCH_NATS} nats.",
    formula=f"token mean of 1[|logp_train_bt - logp_sample_bt| > {MISMATCH_NATS}] {_FRESH}",
    unit="fraction",
    reduction="mean",
    trainers=BOTH,
    section="Sampling against training",
)
SAMPLING_IS_RATIO_MEAN = Metric(
    name="sampling/importance_sampling_ratio/mean",
    meaning="Mean ratio of the training policy's token probability to the sampler's (1 when they agree).",
    formula=f"token mean of exp(logp_train_bt - logp_sample_bt) {_FRESH}",
    unit="ratio",
    reduction="mean",
    trainers=BOTH,
    section="Sampling against training",
    vs_trl="TRL's vLLM correction logs the ratio after truncation; this is the ratio itself.",
)
SAMPLING_IS_RATIO_MIN = Metric(
    name="sampling/importance_sampling_ratio/min",
    meaning="Smallest ratio of the training policy's token probability to the sampler's.",
    formula=f"min of exp(logp_train_bt - logp_sample_bt) {_FRESH}",
    unit="ratio",
    reduction="min",
    trainers=BOTH,
    section="Sampling against training",
)
SAMPLING_IS_RATIO_MAX = Metric(
    name="sampling/importance_sampling_ratio/max",
    meaning="Largest ratio of the training policy's token probability to the sampler's.",
    formula=f"max of exp(logp_train_bt - logp_sample_bt) {_FRESH}",
    unit="ratio",
    reduction="max",
    trainers=BOTH,
    section="Sampling against training",
)

# ----------------------------------------------------------------------------------------------
# Health checks (both trainers), once per logged step
# ----------------------------------------------------------------------------------------------

NONFINITE_STEPS = Metric(
    name="nonfinite_steps",
    meaning="Optimizer steps skipped since the previous logged row because the loss or gradient was NaN or inf.",
    formula="count, over the steps of the logging window, of optimizer steps whose (all-reduced) gradient norm was "
    "not finite; their update is dropped",
    unit="count",
    reduction="last",
    trainers=BOTH,
    section="Health checks",
    importance="stability",
    watch="Should be 0; after max_nonfinite_steps in a row training stops with a checkpoint of the last good state.",
)
HEALTH_WARNINGS = Metric(
    name="health/warnings",
    meaning="Number of health rules firing at warning level at this step (see docs/health.md).",
    formula="count of rules whose condition holds at warning (not critical) severity on the metrics logged so far",
    unit="count",
    reduction="last",
    trainers=BOTH,
    when="health checks are on (--health warn or stop)",
)
HEALTH_CRITICAL = Metric(
    name="health/critical",
    meaning="Number of health rules firing at critical level at this step (see docs/health.md).",
    formula="count of rules whose condition holds at critical severity on the metrics logged so far",
    unit="count",
    reduction="last",
    trainers=BOTH,
    when="health checks are on (--health warn or stop)",
)


# ----------------------------------------------------------------------------------------------
# Sandbox (both trainers): logged by rlhfkit.sandbox's code_reward through log_metric (TRL 1.16), once per call of the
# reward; the window averages each generation's value, as TRL averages what reward functions log
# ----------------------------------------------------------------------------------------------

_SANDBOX = "Sandbox"
_SANDBOX_WHEN = "a reward function that runs code in rlhfkit.sandbox (code_reward, the code task's rewards)"
_SANDBOX_PROGRAMS = "over one call's programs (one per completion with tests), averaged over the window's generations"


def _sandbox_ending(status: str, meaning: str, watch: str) -> Metric:
    return Metric(
        name=f"sandbox/{status}_ratio",
        meaning=meaning,
        formula=f"(programs whose status is {status!r}) / (programs run), {_SANDBOX_PROGRAMS}",
        unit="fraction",
        reduction="mean",
        trainers=BOTH,
        section=_SANDBOX,
        when=_SANDBOX_WHEN,
        watch=watch,
    )


SANDBOX_TIMEOUT_RATIO = _sandbox_ending(
    "timeout",
    "Share of the completions' programs killed at the wall-clock or CPU-time limit (timeout_s).",
    "Rising: the policy writes loops that do not end, or the tests need more time than timeout_s; each one costs the "
    "step timeout_s of a worker.",
)
SANDBOX_MEMORY_RATIO = _sandbox_ending(
    "memory",
    "Share of the completions' programs that died of MemoryError at the address-space limit (memory_mb).",
    "Above 0 for long: the policy allocates without bound, or memory_mb is too small for the interpreter and the tests.",
)
SANDBOX_ERROR_RATIO = _sandbox_ending(
    "error",
    "Share of the completions' programs whose harness ended with an error: a non-zero exit or a signal before it "
    "reported (failed tests are not errors).",
    "Rising: the code kills its own process (os._exit, signals) before the tests run; look at the completions.",
)
SANDBOX_OUTPUT_LIMIT_RATIO = _sandbox_ending(
    "output_limit",
    "Share of the completions' programs killed for writing more than max_output_bytes to stdout or stderr.",
    "Above 0: the code prints in a loop; its tests after the flood count as failed.",
)
SANDBOX_DISK_RATIO = _sandbox_ending(
    "disk",
    "Share of the completions' programs that died writing past their private directory's size (disk_mb).",
    "Above 0: the code writes files without bound.",
)
SANDBOX_MEAN_SECONDS = Metric(
    name="sandbox/mean_seconds",
    meaning="Mean wall-clock seconds of one completion's program in the sandbox, start-up and tests included.",
    formula=f"sum of each program's seconds from the sandbox's start to its end / (programs run), {_SANDBOX_PROGRAMS}",
    unit="s",
    reduction="mean",
    trainers=BOTH,
    section=_SANDBOX,
    when=_SANDBOX_WHEN,
    watch="Near timeout_s: most programs time out; programs run on the sandbox pool's workers (one per CPU) at once.",
)


def _sandbox_evaluated(metric: Metric) -> Metric:
    """The same sandbox metric of an evaluation's completions (eval/sandbox/...)."""
    return _evaluated(metric, "completions", _SANDBOX_PROGRAMS, "over the evaluation's programs")


EVAL_SANDBOX_TIMEOUT_RATIO = _sandbox_evaluated(SANDBOX_TIMEOUT_RATIO)
EVAL_SANDBOX_MEMORY_RATIO = _sandbox_evaluated(SANDBOX_MEMORY_RATIO)
EVAL_SANDBOX_ERROR_RATIO = _sandbox_evaluated(SANDBOX_ERROR_RATIO)
EVAL_SANDBOX_OUTPUT_LIMIT_RATIO = _sandbox_evaluated(SANDBOX_OUTPUT_LIMIT_RATIO)
EVAL_SANDBOX_DISK_RATIO = _sandbox_evaluated(SANDBOX_DISK_RATIO)
EVAL_SANDBOX_MEAN_SECONDS = _sandbox_evaluated(SANDBOX_MEAN_SECONDS)
# The names a reward function logs itself (log_metric) although they are registered (and their eval/ twins, which an
# evaluation logs): rewards/sources.py lets these through where it refuses every other registered name.
LOGGED_BY_REWARD_FUNCTIONS: frozenset[str] = frozenset(
    m.name
    for m in (
        SANDBOX_TIMEOUT_RATIO,
        SANDBOX_MEMORY_RATIO,
        SANDBOX_ERROR_RATIO,
        SANDBOX_OUTPUT_LIMIT_RATIO,
        SANDBOX_DISK_RATIO,
        SANDBOX_MEAN_SECONDS,
    )
)


# ----------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------


def _build_registry(metrics: list[Metric]) -> dict[str, Metric]:
    """Index metrics by name, refusing any name or alias that is used twice."""
    registry: dict[str, Metric] = {}
    seen: dict[str, str] = {}
    for metric in metrics:
        for key in dict.fromkeys((metric.name, *metric.aliases)):  # an older name may be the current one
            if key in seen:
                raise ValueError(f"metric name {key!r} is used by both {seen[key]!r} and {metric.name!r}")
            seen[key] = metric.name
        registry[metric.name] = metric
    return registry


# Declaration order is the logging and documentation order.
REGISTRY: dict[str, Metric] = _build_registry([v for v in list(globals().values()) if isinstance(v, Metric)])

# Older name -> current name (an older name may equal the current one).
ALIASES: dict[str, str] = {alias: m.name for m in REGISTRY.values() for alias in m.aliases}


def is_template(metric: Metric) -> bool:
    """True for a template such as ``rewards/{reward_func_name}/mean`` (one metric per reward function) or
    ``tools/{tool_name}/calls`` (one per tool)."""
    return "{" in metric.name


def expand(metric: Metric, name: str) -> Metric:
    """The concrete metric of a template for one reward function or tool: ``rewards/{reward_func_name}/mean`` and
    "correctness" give ``rewards/correctness/mean``, with the template's reduction and documentation."""
    if not is_template(metric):
        raise ValueError(f"{metric.name} is not a template")
    if not name or any(c in name for c in "{}"):
        raise ValueError(f"invalid reward function or tool name {name!r} for metric {metric.name}")
    start, end = metric.name.index("{"), metric.name.index("}")
    return replace(metric, name=metric.name[:start] + name + metric.name[end + 1 :], aliases=())


def evaluated(metric: Metric) -> Metric:
    """The evaluation twin of a tools metric or template: tools/call_frequency gives eval/tools/call_frequency,
    tools/{tool_name}/calls eval/tools/{tool_name}/calls (expand it after)."""
    return REGISTRY[f"eval/{metric.name}"]


def metrics_for(trainer: str, kind: str | None = "scalar") -> list[Metric]:
    """Metrics a trainer logs, in declaration order; kind "scalar", "histogram" or None for both."""
    if trainer not in TRAINERS:
        raise ValueError(f"unknown trainer {trainer!r}; known trainers: {', '.join(TRAINERS)}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)} or None")
    return [m for m in REGISTRY.values() if trainer in m.trainers and (kind is None or m.kind == kind)]


def older_names(values: dict[str, float]) -> dict[str, float]:
    """The values under the names the older trainer (TRL's original PPOTrainer, up to TRL 0.11) logged them under,
    for dashboards built for it (--log_legacy_names). Metrics it did not log have none."""
    return {alias: value for name, value in values.items() if name in REGISTRY for alias in REGISTRY[name].aliases}
