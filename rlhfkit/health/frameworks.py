"""Other RL frameworks' metric names, mapped onto the names rlhfkit's health rules read, so ``rlhfkit doctor`` can
replay a verl, OpenRLHF, prime-rl, NeMo-RL or SkyRL run through the same rules.

One table per framework, data only: the key as the framework logs it, the rule name it means, the file of the
framework's repository that logs it, and a note where the unit, estimator or averaging differs from rlhfkit's metric
(docs/metrics.md) or where a name belongs to some versions only. A key is mapped only where it measures what the
rule assumes; quantities the rules would read differently (a probability gap for a log-probability gap, a share of
prompts in percent, a statistic the framework does not log but could be derived from two others) are left out.

The names were read in each framework's source (the files named; repositories as of August 2026, older names from
their history). ``map_names`` detects the framework from the keys of a run and renames them; ``render_markdown``
writes the tables as docs/doctor-frameworks.md. This module is pure Python (stdlib and the stdlib-only registry).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from rlhfkit.metrics import registry as M


class Name(NamedTuple):
    """One key a framework logs and the rule name it means."""

    key: str  # as the framework hands it to its loggers (before a tracker prefix such as train/)
    rule: str  # the name rlhfkit's rules read
    source: str  # the file of the framework's repository that logs it
    note: str = ""  # where unit, estimator or averaging differ from rlhfkit's metric; versions


class Framework(NamedTuple):
    """A framework's table. Names are in order of preference: where two keys mean one rule name (an old and a new
    name, two KL terms), the first present in the run is taken."""

    name: str
    repository: str  # owner/name on GitHub
    names: tuple[Name, ...]
    prefixes: tuple[str, ...] = ()  # put before keys by the framework's tracker calls, taken off by rlhfkit's readers
    note: str = ""  # about the framework as a whole, for the docs


REWARD, REWARD_STD, KL, ENTROPY = M.REWARD.name, M.REWARD_STD.name, M.KL.name, M.ENTROPY.name
LENGTH, CLIPPED = M.COMPLETIONS_MEAN_LENGTH.name, M.COMPLETIONS_CLIPPED_RATIO.name
CLIPFRAC, APPROXKL, RATIO = M.POLICY_CLIPFRAC_AVG.name, M.POLICY_APPROXKL_AVG.name, M.VAL_RATIO.name
VALUE_LOSS, VALUE_CLIPFRAC = M.LOSS_VALUE_AVG.name, M.VAL_CLIPFRAC_AVG.name
VPRED, VALUES_MEAN, KL_COEF = M.VAL_VPRED.name, M.VAL_MEAN.name, M.OBJECTIVE_KL_COEF.name
MISMATCH_KL, MASKED_FRAC = M.OFF_POLICY_MISMATCH_KL.name, M.OFF_POLICY_MASKED_FRAC.name
LOGP_GAP, STALENESS = M.SAMPLING_LOGP_DIFFERENCE_MEAN.name, M.ASYNC_STALENESS_MEAN.name

_K1_UPDATE_KL = (
    "k1 estimate, mean of (logp_old - logp_new) over response tokens; rlhfkit's is the k2 estimate 0.5 * (logp_old - "
    "logp_new)^2: the same KL to first order, but k1 can dip below zero"
)
_SEQ_TOKEN_MEAN = "mean over responses of each response's token mean, where rlhfkit pools all tokens"

# verl: volcengine/verl. The actor and critic moved from verl/trainer/ppo/{actor,critic}/ to verl/workers/ in December
# 2024, and the reward KL and entropy names changed in 2025.
_VERL_TRAINER = "verl/trainer/ppo/ray_trainer.py"
_VERL_DATA = "verl/trainer/ppo/metric_utils.py (compute_data_metrics)"
_VERL_ACTOR = "verl/workers/actor/dp_actor.py"
_VERL_CRITIC = "verl/workers/critic/dp_critic.py"
_VERL_LOSS = "verl/trainer/ppo/core_algos.py (compute_policy_loss)"
_VERL_CORR = "verl/trainer/ppo/rollout_corr_helper.py"
VERL = Framework(
    name="verl",
    repository="volcengine/verl",
    note="The console log (`step:N - key:value - ...`) and the file logger's JSONL are read by rlhfkit/health/verl.py; "
    "W&B, TensorBoard and the other trackers get the same keys, without a prefix.",
    names=(
        Name(
            "critic/score/mean",
            REWARD,
            _VERL_DATA,
            "Mean over responses of the summed token-level scores (reward function or model), before the KL penalty "
            "(critic/rewards/mean is after it). verl logs no spread of the scores, so reward_std stays unread.",
        ),
        Name(
            "actor/reward_kl_penalty",
            KL,
            _VERL_TRAINER + " (apply_kl_penalty)",
            "KL to the reference in the reward (use_kl_in_reward), since April 2025. Per token, "
            + _SEQ_TOKEN_MEAN
            + "; estimator algorithm.kl_penalty, default `kl` (k1, can be negative) where "
            "rlhfkit's kl is k3.",
        ),
        Name(
            "critic/kl",
            KL,
            _VERL_TRAINER + " (apply_kl_penalty)",
            "The same quantity before April 2025 (PPO's KL penalty in the reward), same units and caveats.",
        ),
        Name(
            "actor/kl_loss",
            KL,
            _VERL_ACTOR,
            "KL to the reference as a loss term (actor.use_kl_loss, GRPO's setup), per token by loss_agg_mode "
            "(default token-mean), estimator kl_loss_type (default low_var_kl, k3 clamped). Logged as 0.0 when "
            "use_kl_loss is off, hence last in line after the reward KL.",
        ),
        Name(
            "actor/reward_kl_penalty_coeff",
            KL_COEF,
            _VERL_TRAINER + " (apply_kl_penalty)",
            "Coefficient of the KL penalty in the reward, fixed or adaptive (algorithm.kl_ctrl), since April 2025.",
        ),
        Name("critic/kl_coeff", KL_COEF, _VERL_TRAINER + " (apply_kl_penalty)", "Its name before April 2025."),
        Name(
            "actor/entropy",
            ENTROPY,
            _VERL_ACTOR,
            "Exact entropy of the policy on response tokens, per token by loss_agg_mode (default token-mean); "
            "from June 2025, and only with entropy_coeff != 0 or actor.calculate_entropy since November 2025.",
        ),
        Name(
            "actor/entropy_loss",
            ENTROPY,
            _VERL_ACTOR + "; verl/workers/utils/losses.py",
            "The entropy itself (positive), not a loss: compute_entropy_loss returns the masked mean entropy. Its "
            "name until June 2025, and again in the new engine workers (verl/workers/utils/losses.py, late 2025).",
        ),
        Name(
            "actor/pg_clipfrac",
            CLIPFRAC,
            _VERL_LOSS,
            "Share of response tokens where the clipped surrogate is the active term, as rlhfkit's; dual-clip's "
            "lower clip is logged apart (actor/pg_clipfrac_lower).",
        ),
        Name("actor/ppo_kl", APPROXKL, _VERL_LOSS, _K1_UPDATE_KL + "."),
        Name(
            "critic/vf_loss",
            VALUE_LOSS,
            _VERL_CRITIC + "; verl/trainer/ppo/core_algos.py (compute_value_loss)",
            "0.5 * masked mean of the larger of the clipped and unclipped squared errors, as rlhfkit's.",
        ),
        Name("critic/vf_clipfrac", VALUE_CLIPFRAC, _VERL_CRITIC + "; verl/trainer/ppo/core_algos.py"),
        Name(
            "critic/vpred_mean",
            VPRED,
            _VERL_CRITIC,
            "Mean value prediction during the critic's update, averaged over its micro-batches.",
        ),
        Name(
            "critic/values/mean",
            VALUES_MEAN,
            _VERL_DATA,
            "Mean value prediction on response tokens at rollout. verl logs no variance of the returns, so the "
            "value_not_learning rule cannot run.",
        ),
        Name("response_length/mean", LENGTH, _VERL_DATA),
        Name(
            "response_length/clip_ratio",
            CLIPPED,
            _VERL_DATA,
            "Share of responses exactly max_response_length long (since January 2025): one that stopped on its "
            "last allowed token counts too, where rlhfkit counts responses without a terminator.",
        ),
        Name(
            "rollout_corr/k3_kl",
            MISMATCH_KL,
            _VERL_CORR + " (compute_offpolicy_metrics)",
            "k3 KL of the trainer's policy from the rollout's per token, as rlhfkit's; logged when the rollout "
            "log-probs are kept (rollout correction, since November 2025).",
        ),
        Name(
            "mismatch/mismatch_k3_kl",
            MISMATCH_KL,
            "verl/trainer/ppo/mismatch_helper.py",
            "The same, October to November 2025.",
        ),
        Name(
            "rollout_corr/rollout_rs_masked_fraction",
            MASKED_FRAC,
            _VERL_CORR,
            "Share of response tokens rejection sampling masked out (algorithm.rollout_correction.rollout_rs).",
        ),
    ),
)

# OpenRLHF: OpenRLHF/OpenRLHF. Its W&B and TensorBoard loggers put train/ before every training key.
_ORLHF_TRAINER = "openrlhf/trainer/ppo_trainer.py"
_ORLHF_ACTOR = "openrlhf/trainer/ray/ppo_actor.py"
_ORLHF_CRITIC = "openrlhf/trainer/ray/ppo_critic.py"
_ORLHF_MAKER = "openrlhf/trainer/ppo_utils/experience_maker.py"
_ORLHF_LOSS = "openrlhf/models/loss.py (PolicyLoss)"
OPENRLHF = Framework(
    name="OpenRLHF",
    repository="OpenRLHF/OpenRLHF",
    prefixes=("train/",),
    note="Logged through openrlhf/utils/logging_utils.py (WandbLogger, TensorboardLogger) as `train/<key>`; "
    "`reward` and `kl` already carry the rules' names.",
    names=(
        Name(
            "reward",
            REWARD,
            _ORLHF_MAKER + "; " + _ORLHF_ACTOR,
            "Mean reward of the samples (reward model or function), before the KL penalty.",
        ),
        Name(
            "rollout/reward_mean",
            REWARD,
            _ORLHF_TRAINER + " (_compute_rollout_stats)",
            "The same, over the whole rollout batch; since March 2026.",
        ),
        Name(
            "rollout/reward_std",
            REWARD_STD,
            _ORLHF_TRAINER + " (_compute_rollout_stats)",
            "Spread of the rewards over the whole rollout batch (not per group), as rlhfkit's; since March 2026.",
        ),
        Name(
            "kl",
            KL,
            _ORLHF_MAKER + "; " + _ORLHF_ACTOR,
            "KL to the reference per token, " + _SEQ_TOKEN_MEAN + "; estimator algo.kl.estimator, default k1 "
            "(can be negative). With the KL as a loss (algo.kl.use_loss) it is that loss term, per token.",
        ),
        Name(
            "entropy_loss",
            ENTROPY,
            _ORLHF_ACTOR,
            "The policy's exact entropy on response tokens (positive), logged when actor.entropy_coef is set; since "
            "April 2025.",
        ),
        Name("ppo_clip_ratio", CLIPFRAC, _ORLHF_ACTOR + "; " + _ORLHF_LOSS, "Since May 2025."),
        Name("ppo_kl", APPROXKL, _ORLHF_ACTOR + "; " + _ORLHF_LOSS, _K1_UPDATE_KL + "; since May 2025."),
        Name(
            "vllm_kl",
            MISMATCH_KL,
            _ORLHF_LOSS,
            "KL of the vLLM sampler's policy from the trainer's per token, with vLLM importance-sampling correction "
            "on; k1 estimate (mean of logp_rollout - logp_old), where rlhfkit's is k3; since August 2025.",
        ),
        Name(
            "critic_loss",
            VALUE_LOSS,
            _ORLHF_CRITIC + "; openrlhf/models/loss.py (ValueLoss)",
            "0.5 * the clipped squared error, as rlhfkit's.",
        ),
        Name("values", VPRED, _ORLHF_CRITIC, "Mean value prediction of the critic during its update."),
        Name(
            "rollout/response_length_mean", LENGTH, _ORLHF_TRAINER + " (_compute_rollout_stats)", "Since March 2026."
        ),
        Name("response_length", LENGTH, _ORLHF_MAKER + "; " + _ORLHF_ACTOR, "Mean generated tokens per sample."),
        Name(
            "rollout/truncated_rate",
            CLIPPED,
            _ORLHF_TRAINER + " (_compute_rollout_stats)",
            "Share of samples whose generation was cut at the length limit; since March 2026.",
        ),
    ),
)

# prime-rl: PrimeIntellect-ai/prime-rl. The orchestrator (rollouts, rewards) and the trainer log separately; the
# trainer's tensor statistics are "<name>/mean" (src/prime_rl/trainer/utils.py, compute_stats).
_PRIME_ORCH = "src/prime_rl/orchestrator/orchestrator.py"
_PRIME_ORCH_METRICS = "src/prime_rl/orchestrator/metrics.py"
_PRIME_TRAIN = "src/prime_rl/trainer/rl/train.py"
_PRIME_LOSS = "src/prime_rl/trainer/rl/loss.py"
PRIME_RL = Framework(
    name="prime-rl",
    repository="PrimeIntellect-ai/prime-rl",
    prefixes=("train/",),
    note="No KL to a reference by default (the loss has none), so the KL rules stay silent. The orchestrator and "
    "the trainer log their own keys: a run's W&B may hold them as two runs. From June 2026 the orchestrator's keys "
    "start with `train/`, which rlhfkit's readers of W&B and TensorBoard take off; since August 2026 it logs per agent "
    "(`train/agg/<subset>/<agent>/reward/mean`): those keys carry the agent's name and are not mapped. "
    "`solve_none` + `solve_all` is frac_reward_zero_std for 0/1 rewards, a sum, not mapped.",
    names=(
        Name("reward/mean", REWARD, _PRIME_ORCH, "Mean reward of the batch's rollouts; August 2025 to March 2026."),
        Name(
            "reward/all/mean",
            REWARD,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "The same, mean over problems of each problem's mean; March to June 2026.",
        ),
        Name(
            "train/agg/effective/reward/mean",
            REWARD,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "The same over the rollouts shipped to the trainer; June to August 2026.",
        ),
        Name(
            "train/agg/all/reward/mean",
            REWARD,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "The same over every rollout that arrived (filtered ones too); June to August 2026.",
        ),
        Name(
            "completion_len/mean",
            LENGTH,
            _PRIME_ORCH,
            "Mean over problems of the mean completion length; August 2025 to February 2026.",
        ),
        Name(
            "decode_len/mean",
            LENGTH,
            _PRIME_ORCH,
            "Tokens the policy generated per rollout (every turn), mean over problems; February 2026.",
        ),
        Name("decode_len/all/mean", LENGTH, _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS, "The same, March to June 2026."),
        Name(
            "train/agg/effective/num_output_tokens/mean",
            LENGTH,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "Output tokens per shipped rollout; June to August 2026.",
        ),
        Name(
            "train/agg/all/num_output_tokens/mean",
            LENGTH,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "The same over every rollout that arrived; June to August 2026.",
        ),
        Name("is_truncated/mean", CLIPPED, _PRIME_ORCH, "Share of truncated rollouts; August 2025 to March 2026."),
        Name("is_truncated/all/mean", CLIPPED, _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS, "March to June 2026."),
        Name(
            "train/agg/effective/is_truncated/mean",
            CLIPPED,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "Over the shipped rollouts; June to August 2026.",
        ),
        Name(
            "train/agg/all/is_truncated/mean",
            CLIPPED,
            _PRIME_ORCH + "; " + _PRIME_ORCH_METRICS,
            "Over every rollout that arrived; June to August 2026.",
        ),
        Name(
            "entropy/all/mean",
            ENTROPY,
            _PRIME_TRAIN,
            "Exact entropy on the trained tokens, mean over all of them; since May 2026.",
        ),
        Name("entropy/mean", ENTROPY, _PRIME_TRAIN, "Its name from August 2025 to May 2026."),
        Name(
            "mismatch_kl/all/mean",
            MISMATCH_KL,
            _PRIME_TRAIN + "; " + _PRIME_LOSS,
            "k3 KL between the trainer's and the inference server's log-probs per token, staleness included (the "
            "trainer runs ahead of the sampler), as rlhfkit's; since May 2026.",
        ),
        Name(
            "mismatch_kl/mean",
            MISMATCH_KL,
            _PRIME_TRAIN + "; " + _PRIME_LOSS,
            "The same, August 2025 to May 2026; from October 2025 to February 2026 the " + _SEQ_TOKEN_MEAN + ".",
        ),
        Name(
            "is_masked/mean",
            MASKED_FRAC,
            _PRIME_LOSS,
            "Share of trained tokens the importance-ratio bounds masked out (token and sequence masks); since "
            "October 2025.",
        ),
        Name(
            "off_policy/mean",
            STALENESS,
            _PRIME_ORCH,
            "Mean staleness of the shipped rollouts in policy versions (steps); since August 2026.",
        ),
    ),
)

# NeMo-RL: NVIDIA-NeMo/RL. grpo.py and ppo.py log the training metrics with prefix "train" (nemo_rl/utils/logger.py).
_NEMO_LOSS = "nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossFn)"
_NEMO_VALUE = "nemo_rl/algorithms/loss/loss_functions.py (MseValueLossFn); nemo_rl/algorithms/ppo.py"
_NEMO_ROLLOUTS = "nemo_rl/experience/rollouts.py"
NEMO_RL = Framework(
    name="NeMo-RL",
    repository="NVIDIA-NeMo/RL",
    prefixes=("train/",),
    note="Training metrics are logged as `train/<key>` (validation as `validation/<key>`, not mapped: its accuracy "
    "is the environment's reward on held-out prompts, not an independent check). Loss-function metrics moved from "
    "nemo_rl/algorithms/loss_functions.py to nemo_rl/algorithms/loss/ in March 2026. `baseline_reward/pct_mixed` is "
    "100 * (1 - frac_reward_zero_std) for 0/1 rewards, in percent: not mapped.",
    names=(
        Name(
            "reward",
            REWARD,
            "nemo_rl/algorithms/grpo.py",
            "Mean total reward of the training batch.",
        ),
        Name(
            "kl_penalty",
            KL,
            _NEMO_LOSS,
            "KL to the reference per token (the loss term divided by reference_policy_kl_penalty; 0 when that is "
            "0), estimator reference_policy_kl_type, default k3 as rlhfkit's.",
        ),
        Name(
            "approx_entropy",
            ENTROPY,
            _NEMO_LOSS,
            "Sampled estimate of the entropy per token, mean of -(pi/pi_gen) log pi over the generated tokens, "
            "where rlhfkit's is exact.",
        ),
        Name("probs_ratio", RATIO, _NEMO_LOSS, "Mean of pi/pi_old over valid tokens, as rlhfkit's."),
        Name(
            "gen_kl_error",
            MISMATCH_KL,
            _NEMO_LOSS,
            "KL of the generation (vLLM) policy from the trainer's per token, estimator reference_policy_kl_type "
            "(default k3, as rlhfkit's); since October 2025.",
        ),
        Name(
            "mean_gen_tokens_per_sample",
            LENGTH,
            _NEMO_ROLLOUTS,
            "Tokens the policy generated per sample, every turn together.",
        ),
        Name("truncation_rate", CLIPPED, _NEMO_ROLLOUTS, "Share of samples that hit max_tokens without a stop token."),
        Name(
            "critic/loss",
            VALUE_LOSS,
            _NEMO_VALUE,
            "PPO (since June 2026): 0.5 * scale * the clipped squared error, as rlhfkit's when scale is 1.",
        ),
        Name("critic/vf_clipfrac", VALUE_CLIPFRAC, _NEMO_VALUE, "PPO, since June 2026."),
        Name(
            "critic/values_mean",
            VPRED,
            _NEMO_VALUE,
            "PPO: mean value prediction of the value model during its update, since June 2026.",
        ),
    ),
)

# SkyRL: NovaSky-AI/SkyRL. Before March 2026 the trainer lived in skyrl-train/skyrl_train/ (same keys).
_SKY_TRAINER = "skyrl/train/trainer.py"
_SKY_WORKER = "skyrl/backends/skyrl_train/workers/worker.py"
_SKY_PPO = "skyrl/backends/skyrl_train/utils/ppo_utils.py"
SKYRL = Framework(
    name="SkyRL",
    repository="NovaSky-AI/SkyRL",
    note="The trainer prefixes the workers' metrics with `policy/` and `critic/` (skyrl/train/trainer.py); until "
    "March 2026 the same code lived in skyrl-train/skyrl_train/.",
    names=(
        Name("reward/avg_raw_reward", REWARD, _SKY_TRAINER, "Mean raw reward of the generated samples."),
        Name(
            "loss/avg_kl",
            KL,
            _SKY_TRAINER + " (apply_reward_kl_penalty)",
            "KL to the reference in the reward (use_kl_in_reward), per token, "
            + _SEQ_TOKEN_MEAN
            + "; estimator kl_estimator_type, default k3 as rlhfkit's.",
        ),
        Name(
            "policy/policy_kl",
            KL,
            _SKY_WORKER,
            "KL to the reference as a loss term (use_kl_loss), per token, " + _SEQ_TOKEN_MEAN + "; default k3.",
        ),
        Name(
            "loss/kl_loss_coef",
            KL_COEF,
            _SKY_TRAINER + " (apply_reward_kl_penalty)",
            "Coefficient of the KL in the reward, fixed or adaptive.",
        ),
        Name("policy/policy_entropy", ENTROPY, _SKY_WORKER, "Exact entropy on response tokens, token mean."),
        Name(
            "policy/loss_metrics/clip_ratio",
            CLIPFRAC,
            _SKY_WORKER + "; " + _SKY_PPO,
            "Share of tokens where the clipped surrogate is active (for CISPO: where its cap hit); since February "
            "2026.",
        ),
        Name(
            "policy/ppo_clip_ratio",
            CLIPFRAC,
            "skyrl-train/skyrl_train/workers/worker.py",
            "Its name until February 2026.",
        ),
        Name(
            "policy/rollout_train_logprobs_abs_diff_mean",
            LOGP_GAP,
            _SKY_TRAINER,
            "Mean |logp_rollout - logp_train| over response tokens, the trainer's forward before the update, as "
            "rlhfkit's; logged when the generator returns log-probs, since January 2026 (before: a gap of "
            "probabilities, not mapped).",
        ),
        Name(
            "critic/critic_loss",
            VALUE_LOSS,
            _SKY_WORKER + "; " + _SKY_PPO + " (ppo_critic_loss)",
            "0.5 * the clipped squared error, " + _SEQ_TOKEN_MEAN + ".",
        ),
        Name("critic/values_clipfrac", VALUE_CLIPFRAC, _SKY_WORKER + "; " + _SKY_PPO),
        Name("critic/values_mean", VPRED, _SKY_WORKER, "Mean value prediction during the critic's update."),
        Name(
            "generate/avg_num_tokens",
            LENGTH,
            "skyrl/train/generators/utils.py",
            "Mean response length in tokens (multi-turn: the whole response, tool output included; "
            "generate/avg_assistant_tokens counts the policy's own).",
        ),
    ),
)

FRAMEWORKS: tuple[Framework, ...] = (VERL, OPENRLHF, PRIME_RL, NEMO_RL, SKYRL)
# Every name the tables map onto: a run already logging several of these uses rlhfkit's (TRL's) names.
RULE_NAMES = frozenset(name.rule for framework in FRAMEWORKS for name in framework.names)


def spellings(framework: Framework, key: str) -> tuple[str, ...]:
    """The ways `key` may appear in a run of `framework`: with each of its prefixes and without (rlhfkit's readers
    of W&B and TensorBoard take train/ off), the bare key first."""
    bare = next((key[len(p) :] for p in framework.prefixes if key.startswith(p)), key)
    return (bare, *(prefix + bare for prefix in framework.prefixes))


def known_keys(framework: Framework, keys: Iterable[str]) -> set[str]:
    """The keys of a run that `framework`'s table names, in any spelling."""
    table = {spelling for name in framework.names for spelling in spellings(framework, name.key)}
    return table.intersection(keys)


def detect(keys: Iterable[str]) -> Framework | None:
    """The framework whose table knows the most of a run's keys (the first in FRAMEWORKS on a tie), provided it
    knows more of them than there are keys already under the rules' names; None otherwise (an rlhfkit or TRL run)."""
    keys = set(keys)
    native = len(keys & RULE_NAMES)
    best = max(FRAMEWORKS, key=lambda framework: len(known_keys(framework, keys)))
    return best if len(known_keys(best, keys)) > native else None


def renames(framework: Framework, keys: Iterable[str]) -> dict[str, str]:
    """{rule name: the run's key} for every rule name the table gives a key of the run to, in table order (the first
    present key wins), never for a rule name the run already logs, and never a key onto itself."""
    keys = set(keys)
    found: dict[str, str] = {}
    for name in framework.names:
        if name.rule in keys or name.rule in found:
            continue
        key = next((spelling for spelling in spellings(framework, name.key) if spelling in keys), None)
        if key is not None and key != name.rule:
            found[name.rule] = key
    return found


def _rename(row: Mapping[str, Any], sources: Mapping[str, str]) -> dict[str, Any]:
    """`row` with each key of `sources` (rule name -> key, from renames: no rule name the run logs) under its rule
    name, where the key stood."""
    rule_of = {key: rule for rule, key in sources.items()}
    return {rule_of.get(key, key): value for key, value in row.items()}


def map_names(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str], str | None]:
    """A run's rows with a framework's keys renamed to the names rlhfkit's rules read, {rule name: the framework's
    key}, and the framework's name; the rows unchanged, {} and None when no framework's table matches (the run
    already uses rlhfkit's or TRL's names). The framework is detected from all the rows' keys together."""
    rows = [dict(row) for row in rows]
    keys = {key for row in rows for key in row if key != "step"}
    framework = detect(keys)
    if framework is None:
        return rows, {}, None
    sources = renames(framework, keys)
    return [_rename(row, sources) for row in rows], sources, framework.name


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """docs/doctor-frameworks.md: every framework's table, what each key means to the rules and where it is logged."""
    lines = [
        "# Runs of other RL frameworks in `rlhfkit doctor`",
        "",
        "<!-- Generated by `make docs` from rlhfkit/health/frameworks.py.",
        "     Do not edit by hand; tests/test_docs.py checks it. -->",
        "",
        "`rlhfkit doctor` replays a run's logged metrics through the health rules (docs/health.md). The rules read "
        "rlhfkit's names, which are TRL's; a run of another framework logs the same quantities under its own keys. "
        "The doctor detects the framework from the keys (the one whose table below knows the most of them, provided "
        "it knows more than there are keys already under the rules' names) and reads each key as the rule name in "
        "the second column. A key is mapped only where it measures what the rule assumes; the notes say where the "
        "estimator, unit or averaging differ from rlhfkit's metric (docs/metrics.md) and which versions log a name. "
        "Where two keys mean one rule name, the first present in the run is read, and a name the run already logs "
        "is never replaced.",
        "",
        "Every key was read in the framework's own source, in the file named (repositories as of August 2026; older "
        "names from their history).",
    ]
    for framework in FRAMEWORKS:
        lines += ["", f"## {framework.name}", "", f"Repository: [{framework.repository}]"
                  f"(https://github.com/{framework.repository}).", ""]  # fmt: skip
        if framework.note:
            lines += [framework.note, ""]
        if framework.prefixes:
            shown = ", ".join(f"`{prefix}`" for prefix in framework.prefixes)
            lines += [f"Keys are recognised with and without {shown} in front.", ""]
        lines += ["| their key | rule name | notes | logged in |", "|---|---|---|---|"]
        for name in framework.names:
            lines.append(f"| `{name.key}` | `{name.rule}` | {_cell(name.note)} | {_cell(name.source)} |")
    return "\n".join(lines) + "\n"
