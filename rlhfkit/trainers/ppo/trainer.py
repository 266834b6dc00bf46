"""PPO for language models with a learned value model and a per-token KL penalty to a frozen reference.

Variant: "The N+ Implementation Details of RLHF with PPO" (Huang et al., 2024), the design behind TRL's
PPOv2 trainer, itself following Ziegler et al. (2019) and Stiennon et al. (2020):

* reward_t = -kl_coef * KL_t(policy || reference) on every completion token, plus the score on the last real
  completion token: the reward model's, or with reward functions (verifiable rewards, as verl and OpenRLHF offer)
  the weighted sum of the functions' and the reward model's; optional EOS trick (non_eos_penalty /
  missing_eos_penalty);
* GAE(gamma, lam) over completion tokens with the value model (initialised from the reward model, else from the
  policy's weights with a zero score head); advantages whitened over the generation batch;
* clipped policy surrogate and clipped value loss; num_ppo_epochs x num_mini_batches optimizer steps per
  generation batch, each mini-batch accumulated from per_device_train_batch_size micro-batches;
* learning rate decayed linearly to 0 over the updates (--lr_scheduler_type: transformers' schedules, stepped once
  per update as TRL does); optional adaptive KL controller (Ziegler et al.).

Deviations from TRL's trainer, each deliberate (docs/algorithms/ppo.md gives the details):
* the score is added on the last real completion token, not on the first padding position after it (TRL #3750);
* every per-token statistic is a masked mean over real completion tokens, pooled over micro-batches and
  processes (no sentinel values leak into objective/entropy, val/ratio or policy/approxkl_avg);
* one optimizer step per mini-batch (TRL steps once per gradient_accumulation_steps micro-batches).

LoRA (--use_peft): the policy and the value model train adapters (the value model's score head in full); the
reference is the policy with its adapter disabled, not a copy (add_adapters, reference_logprobs).

Tools (PPOTrainer(tools=[...]), max_tool_calling_iterations; no TRL PPO has them, verl's multi-turn PPO does): each
completion is a multi-turn episode (agents.episodes.ToolEpisodes: the policy's turns, the tools' results between them), the
reward functions get its messages. The policy and the value model read every token, but only the policy's own tokens
(Chunk.model_mask, PPOBatch.model_mask) are steps: the KL penalty, the score (on the last of them), GAE (which skips the
tool results, ops.gae: each turn's last token bootstraps from the next turn's first value), the whitening, both losses
and every per-token metric are over them; completion lengths count them.

Asynchronous generation (--async_generation, docs/async.md): a worker process samples each update's completions with a
copy of the policy up to max_staleness updates older (generation_worker.py); the batch keeps its staleness, and
micro_step weights a stale batch's policy term by TRL 1.16's importance-sampling correction (offpolicy.py). The value
model, the reference and the rewards stay in the trainer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import NamedTuple

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.trainer_utils import TrainOutput

from rlhfkit import ops
from rlhfkit.agents import ToolBox
from rlhfkit.agents.episodes import check_agent_arguments, tool_episodes, tool_metrics
from rlhfkit.checkpoint import VALUE_MODEL_DIR, load_weights
from rlhfkit.config import PPOConfig, ppo_batch_sizes
from rlhfkit.data import endless_batches
from rlhfkit.engines import substate
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import (
    LORA_FLAGS,
    Hub,
    disable_dropout,
    frozen_copy,
    value_model_from_policy,
    weight_dtype,
    with_lora,
)
from rlhfkit.rewards import (
    RewardModelFunction,
    RewardSources,
    reward_name,
    reward_sources,
)
from rlhfkit.sampling import decode, sampling_config, terminator_ids
from rlhfkit.trainers.api import TRLTrainerAPI, trl_constructor_arguments
from rlhfkit.trainers.datasets import tokenize_datasets
from rlhfkit.trainers.evaluation import count_task_success, eval_chunks
from rlhfkit.trainers.generation_worker import AsyncGeneration, generating, start_generation_worker
from rlhfkit.trainers.offpolicy import log_sampling_mismatch, off_policy_weights
from rlhfkit.trainers.ppo.generation import PPOBatch, PPOGeneration
from rlhfkit.trainers.ppo.model import PolicyAndValue
from rlhfkit.trainers.run import TrainingRun
from rlhfkit.trainers.sampler import Sampler
from rlhfkit.trainers.schedule import epoch_end_steps
from rlhfkit.trainers.scoring import score_chunk, take_reward_logs


class ShapedRewards(NamedTuple):
    """An update's per-token rewards (step 2), each (B, T) and 0 outside the policy's tokens (PPOBatch.model_mask)."""

    kl: torch.Tensor  # KL(policy || reference) estimate per token (--kl_estimator)
    rewards: torch.Tensor  # -kl_coef x kl, plus the score at the policy's last token (whitened with --whiten_rewards)
    non_score_reward: torch.Tensor  # -kl_coef x kl
    kl_coef: float  # the coefficient used (the adaptive controller moves it after the update)


class PPOTrainer(TRLTrainerAPI):
    """PPO trainer; see the module docstring for the exact variant. ``train()`` runs the whole loop.

    TRL 1.12's arguments and methods (api.py: callbacks, state, save_model, evaluate, log, ...; peft_config is a
    LoRA config, which sets --use_peft and the lora_* fields), plus: reward_model optional when reward_funcs are given; reward_funcs: one or a list of
    callables ``f(prompts, completions, **columns) -> list[float | None]``, reward-model paths or sequence-
    classification models with their own tokenizer (as GRPOTrainer takes them), scored beside reward_model and
    weighted by args.reward_weights (functions, then reward_model); reward_processing_classes: the tokenizers of
    reward models given in reward_funcs as modules. value_model: default a copy of reward_model, else the policy's
    weights with a zero score head (models.value_model_from_policy). task: a built-in ``Task`` whose checker measures
    true success. tools: as GRPOTrainer's (TRL 1.16's), typed functions with Google-style docstrings (sync or async)
    the policy may call in multi-turn episodes, up to args.max_tool_calling_iterations rounds of results within
    response_length tokens; the prompts must be conversations; kept as ``trainer.tools`` (see the module docstring).
    """

    def __init__(
        self,
        args: PPOConfig,
        processing_class: PreTrainedTokenizerBase,
        model: nn.Module,
        ref_model: nn.Module | None = None,
        reward_model: nn.Module | None = None,
        train_dataset: Dataset | None = None,
        value_model: nn.Module | None = None,
        data_collator=None,
        eval_dataset: Dataset | None = None,
        optimizers=(None, None),
        callbacks: Sequence | None = None,
        peft_config=None,
        task=None,
        reward_funcs: Callable | str | nn.Module | Sequence[Callable | str | nn.Module] | None = None,
        reward_processing_classes: Sequence[PreTrainedTokenizerBase | None] | None = None,
        tools: Sequence[Callable] | None = None,
    ):
        args = trl_constructor_arguments(args, peft_config, optimizers=optimizers, data_collator=data_collator)
        # 1. What can be refused before anything loads: the tools' schemas, the agent arguments, no data, no reward.
        toolbox = ToolBox(tools) if tools else None
        check_agent_arguments("PPOTrainer", args, toolbox)
        if train_dataset is None:
            raise ConfigError("PPOTrainer needs a train_dataset with a prompt column.")
        if reward_model is None and reward_funcs is None:
            raise ConfigError(
                "PPOTrainer needs a reward: pass reward_model (a sequence-classification model with the policy's "
                "vocabulary) and/or reward_funcs (functions f(prompts, completions, **columns) -> list[float])."
            )
        self.args = args
        # 2. The run: output_dir, trackers, checkpoint to resume (read, nothing written yet); async_generation's worker
        #    starts now and imports while the models load (it gets the policy at the end).
        self.run = run = TrainingRun(args)
        self.accelerator = run.accelerator
        self.generation_worker: AsyncGeneration | None = (
            start_generation_worker(run, args) if args.async_generation else None
        )
        # 3. Data: the prompts tokenized (conversations shown their tools: TRL 1.16's `tools` attribute, empty without
        #    them), multi-turn sampling with tools.
        self.tokenizer = processing_class
        self.task = task
        self.stop_ids = terminator_ids(processing_class, model, args.stop_token_id)
        self.tools = [] if toolbox is None else toolbox.functions
        self.eval_dataset = eval_dataset  # as given (transformers' attribute); eval_prompts: tokenized
        self.train_dataset, self.eval_prompts = tokenize_datasets(
            args, processing_class, train_dataset, eval_dataset, self.tools or None
        )
        self.episodes = tool_episodes(
            "PPOTrainer", toolbox, processing_class, self.train_dataset, args, args.response_length
        )
        if self.generation_worker is not None and self.episodes is not None:  # the worker runs the tools
            self.generation_worker.sample_episodes_with(self.episodes)
        self.sizes = ppo_batch_sizes(args, run.accelerator.num_processes, len(self.train_dataset))
        # 4. The models: the value model, LoRA adapters or the frozen reference, prepared for the engine with the
        #    reward sources; the policy and the value model trained behind one forward, with their optimizer.
        if value_model is None:  # from the reward model (TRL), else from the policy's weights with a zero head
            value_model = frozen_copy(reward_model) if reward_model is not None else value_model_from_policy(model)
        if args.use_peft:  # LoRA: adapters on the policy and the value model; no reference copy (see add_adapters)
            model, value_model = self.add_adapters(model, ref_model, value_model)
        else:
            value_model.requires_grad_(True)
            ref_model = ref_model if ref_model is not None else frozen_copy(model)
        if args.disable_dropout:  # the first ratio of an update is then exactly 1
            for m in (model, ref_model, reward_model, value_model):
                if m is not None:
                    disable_dropout(m)
        self.ref_model = run.prepare_frozen(ref_model)  # sharded for ZeRO-3 / FSDP as the policy is
        self.reward_model = reward_model = run.prepare_frozen(reward_model)
        self.rewards = self.reward_sources(reward_funcs, reward_processing_classes, reward_model)
        self.rewards.prepare_models(run.prepare_frozen)
        model.generation_config.pad_token_id = processing_class.pad_token_id
        self.model, self.optimizer = run.prepare_trained(
            PolicyAndValue(model, value_model, args.padding_free), model, (model, value_model)
        )
        # Where exact (run.sampling_logprobs_exact), generation skips the policy forward; PPO's first ratio is then 1
        # up to fp32 rounding. Elsewhere a full forward recomputes them, as the update will see them.
        # 5. Step 1, the generation: a batch of prompts completed, with log-probs, reference log-probs and values,
        #    and scored; the adaptive KL controller (kl_target); then the run takes its trainer.
        sampler = Sampler(self.sampling_config, self.episodes, self.generation_worker)
        self.generation = PPOGeneration(
            args, self.sizes, run, self.model, self.ref_model, self.rewards, sampler, processing_class,
            self.train_dataset, reuse_sampling_logprobs=run.sampling_logprobs_exact(model),
        )  # fmt: skip
        self.kl_ctl = (
            ops.AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon) if args.kl_target else None
        )
        num_updates = self.sizes.num_total_batches
        epoch_ends = epoch_end_steps(num_updates, len(self.train_dataset), self.sizes.batch_size)
        # Per-source rewards/<name>/mean|std only with reward functions: a reward model alone logs TRL's keys alone.
        self.log_sources = reward_funcs is not None
        extra_metrics = [m for pair in self.rewards.metrics for m in pair] if self.log_sources else []
        extra_metrics += tool_metrics(toolbox)
        self.eval_tool_metrics = tool_metrics(toolbox, evaluation=True)  # an evaluation's eval/tools/{tool}/...
        run.start(self, num_updates, extra_metrics, "update", epoch_ends, callbacks, loss=M.LOSS_TOTAL_AVG)

    # What the run lifecycle needs from its trainer (run.Trainee): models, own state, evaluation.
    def write_models(self, directory: str, state_dict: dict | None = None) -> None:
        """Policy (loadable on its own), value model in value_model/, and the tokenizer. With --use_peft, peft's
        save_pretrained writes the adapters (adapter_config.json, adapter_model.safetensors), not the base weights.
        state_dict: the full weights gathered from a sharding engine (TrainingRun), else None (the models' own)."""
        model = self.unwrapped
        model.policy.save_pretrained(directory, state_dict=substate(state_dict, "policy."))
        value_dir = os.path.join(directory, VALUE_MODEL_DIR)
        model.value_model.save_pretrained(value_dir, state_dict=substate(state_dict, "value_model."))
        self.tokenizer.save_pretrained(directory)

    def load_models(self, directory, trained: bool = True) -> None:
        """The policy and value model of a checkpoint (trained: False when the engine restored them itself)."""
        if trained:
            load_weights(self.unwrapped.policy, directory)
            load_weights(self.unwrapped.value_model, os.path.join(directory, VALUE_MODEL_DIR))

    def state_dict(self) -> dict:
        return {"kl_ctl": self.kl_ctl.state_dict()} if self.kl_ctl is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.kl_ctl is not None:
            self.kl_ctl.load_state_dict(state["kl_ctl"])

    @property
    def unwrapped(self) -> PolicyAndValue:
        return self.accelerator.unwrap_model(self.model)

    @property
    def policy(self) -> nn.Module:
        return self.unwrapped.policy

    @property
    def kl_coef(self) -> float:
        return self.kl_ctl.value if self.kl_ctl else self.args.kl_coef

    def reward_sources(self, reward_funcs, processing_classes, reward_model: nn.Module | None) -> RewardSources:
        """The reward functions (and reward models with their own tokenizer) given in reward_funcs, then the reward
        model, which reads the policy's tokenizer and scores its token ids in chunks of
        local_rollout_forward_batch_size, as TRL's PPO does."""
        args, acc = self.args, self.accelerator
        names, funcs = [], []
        if reward_funcs is not None:
            dtype, hub = (
                weight_dtype(args.dtype),
                Hub(
                    revision=args.model_revision,
                    trust_remote_code=args.trust_remote_code,
                    attn_implementation=args.attn_implementation,
                ),
            )
            names, funcs = reward_sources(reward_funcs, processing_classes, self.tokenizer, dtype, acc.device, hub)
        if reward_model is not None:
            name, size = reward_name(reward_model), args.local_rollout_forward_batch_size
            names.append(name)
            funcs.append(RewardModelFunction(reward_model, self.tokenizer, name, True, size, policy_tokens=True))
        return RewardSources(names, funcs, args.reward_weights, args.dataset_text_field)

    # LoRA (--use_peft): adapters, and the reference as the adapter-disabled policy.
    def add_adapters(self, model: nn.Module, ref_model, value_model) -> tuple[nn.Module, nn.Module]:
        """The policy and the value model with LoRA adapters (models.with_lora); their base weights stay frozen.

        The value model (by default a copy of the reward model) gets its own adapter with peft's task type SEQ_CLS,
        whose score head peft trains in full: a fresh value head must learn the returns' scale, which a low-rank
        update of the backbone alone would not give it. There is no reference model: it is the policy with its
        adapter disabled (PPOGeneration.reference_logprobs)."""
        if ref_model is not None:
            raise ConfigError(
                "PPOTrainer got a ref_model and use_peft: with LoRA the reference is the policy with its adapter "
                "disabled. Pass ref_model=None."
            )
        args = self.args
        lora = {flag: getattr(args, flag) for flag in LORA_FLAGS.values()}
        settings = dict(disable_dropout=args.disable_dropout, revision=args.model_revision)
        return with_lora(model, lora, **settings), with_lora(value_model, lora, **settings, task_type="SEQ_CLS")

    # ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Train to the end (or a callback's stop); returns transformers' TrainOutput(global_step, training_loss,
        metrics), training_loss the mean over the updates of this call of loss/total_avg, the loss each update
        minimised (policy loss plus vf_coef x value loss, pooled over its tokens; api.py)."""
        args, sizes, run, acc = self.args, self.sizes, self.run, self.accelerator
        run.begin(resume_from_checkpoint)  # restores the checkpoint being resumed; opens the run directory
        if self.generation_worker is not None:  # the policy's weights as training starts (a resumed run's too)
            with run.gathered(self.model) as model:
                config = self.sampling_config(args.response_length)
                self.generation_worker.load(model.policy, config, run.progress.step)
        prompts = endless_batches(
            len(self.train_dataset),
            sizes.local_batch_size,
            args.seed,
            acc.process_index,
            acc.num_processes,
            skip=run.progress.step,  # one batch per update
            shuffle=args.shuffle_dataset,
        )
        # The generation worker (async_generation) ends with the training, however it ends.
        with generating(self.generation_worker):
            self.training_loop(prompts)
        return self.run.train_output

    def training_loop(self, prompts: Iterator[list[int]]) -> None:
        run = self.run
        for update in run.steps():
            # 1. Generate: complete a batch of prompts with the current policy (async_generation: take the worker's
            #    next batch, sampled by a policy at most max_staleness updates older), then score the completions.
            with run.phase("rollout"):
                batch = self.generation.generate(prompts)

            # 2. Rewards: per-token KL penalty to the reference, score on the last real completion token.
            rewards = self.shaped_rewards(batch)

            # 3. Advantages: GAE over completion tokens, then whitened over the generation batch (the generation's
            #    statistics are logged here).
            gae = self.advantages(batch, rewards)

            # 4. Optimise: num_ppo_epochs passes of shuffled mini-batches, one optimizer step per mini-batch.
            with run.phase("optimization"):
                self.optimize(batch, gae)

            # 5. Adapt the KL coefficient towards kl_target with this update's KL (Ziegler et al. 2019), if enabled.
            self.adapt_kl_coef(rewards.kl)

            # 6. Log the window, health checks, evaluation and checkpoints on schedule; stop early if asked.
            run.end_step(update, self.last_scalars(rewards.kl_coef))

    # 1. Generate ------------------------------------------------------------------------------------------------
    def sampling_config(self, max_new_tokens: int):
        """The training sampler's GenerationConfig (the generation's Sampler.config)."""
        args, tok = self.args, self.tokenizer
        return sampling_config(max_new_tokens, args.temperature, tok.pad_token_id, self.stop_ids)

    # 2. Rewards, 3. Advantages ---------------------------------------------------------------------------------
    def shaped_rewards(self, batch: PPOBatch) -> ShapedRewards:
        """Per-token rewards: -kl_coef x KL(policy || reference) on every token the policy sampled (--kl_estimator),
        plus the score on the last of them; whitened with --whiten_rewards (keeping the mean) over them. With tools,
        the tools' results get no reward: they are not the policy's actions."""
        args, mask, kl_coef = self.args, batch.model_mask, self.kl_coef
        kl = ops.kl_per_token(batch.old_logprobs, batch.ref_logprobs, args.kl_estimator) * mask
        shaped = ops.kl_penalized_rewards(batch.scores, kl, mask, kl_coef)
        rewards = ops.masked_whiten(shaped.rewards, mask, keep_mean=True) if args.whiten_rewards else shaped.rewards
        return ShapedRewards(kl, rewards, shaped.non_score_reward, kl_coef)

    def advantages(self, batch: PPOBatch, rewards: ShapedRewards) -> ops.GAEOutput:
        """GAE(gamma, lam) over the tokens the policy sampled (with tools, skipping the tools' results: ops.gae links
        each token to the policy's next one), the advantages whitened over them in the generation batch (this
        process's), and the returns; the generation's statistics are logged from the raw GAE."""
        mask = batch.model_mask
        gae = ops.gae(rewards.rewards, batch.values, mask, self.args.gamma, self.args.lam)
        self.log_generation(batch, rewards, gae)
        return ops.GAEOutput(advantages=ops.masked_whiten(gae.advantages, mask), returns=gae.returns)

    def log_generation(self, batch: PPOBatch, rewards: ShapedRewards, gae: ops.GAEOutput) -> None:
        """Statistics of the scored generation batch, pooled over processes when reduced; per token and lengths over
        the tokens the policy sampled (with tools, the tools' results left out)."""
        m, mask = self.run.metrics, batch.model_mask
        n = len(batch.scores)
        seq_kl, seq_nsr = rewards.kl.sum(1), rewards.non_score_reward.sum(1)
        m.add(M.OBJECTIVE_KL, seq_kl.sum(), n)
        m.add(M.OBJECTIVE_ENTROPY, (-batch.old_logprobs * mask).sum(), n)
        m.add(M.OBJECTIVE_NON_SCORE_REWARD, seq_nsr.sum(), n)
        m.add(M.OBJECTIVE_SCORES, batch.scores.sum(), n)
        m.add_tensor(M.OBJECTIVE_SCORES_STD, batch.scores)
        m.add(M.OBJECTIVE_RLHF_REWARD, (batch.scores + seq_nsr).sum(), n)
        m.add(M.VAL_NUM_EOS_TOKENS, batch.terminated.sum())
        m.add_tensor(M.COMPLETIONS_CLIPPED_RATIO, (~batch.terminated).double())
        tokens = mask.sum()
        m.add(M.VAL_MEAN, (batch.values * mask).sum(), tokens)
        m.add_tensor(M.VAL_VAR, batch.values, mask)
        m.add(M.VAL_ERROR, ((batch.values - gae.returns) ** 2 * mask).sum(), tokens)
        m.add(M.VAL_VAR_EXPLAINED, ops.explained_variance(batch.values, gae.returns, mask), 1)
        m.add(M.RETURNS_MEAN, (gae.returns * mask).sum(), tokens)
        m.add_tensor(M.RETURNS_VAR, gae.returns, mask)
        m.add(M.POLICY_ADVANTAGES_MEAN, (gae.advantages * mask).sum(), tokens)
        prompt_lengths, completion_lengths = batch.prompt_mask.sum(1).double(), mask.sum(1).double()
        m.add(M.TOKENS_QUERIES_LEN_MEAN, prompt_lengths.sum(), n)
        m.add_tensor(M.TOKENS_QUERIES_LEN_STD, prompt_lengths)
        m.add(M.TOKENS_RESPONSES_LEN_MEAN, completion_lengths.sum(), n)
        m.add_tensor(M.TOKENS_RESPONSES_LEN_STD, completion_lengths)
        m.add_values(M.ENV_REWARD_DIST, batch.scores)
        m.add_values(M.OBJECTIVE_KL_DIST, seq_kl)
        m.add_values(M.OBJECTIVE_LOGPROBS, batch.old_logprobs[mask])
        m.add_values(M.OBJECTIVE_REF_LOGPROBS, batch.ref_logprobs[mask])
        m.add_values(M.TOKENS_QUERIES_DIST, prompt_lengths)
        m.add_values(M.TOKENS_RESPONSES_DIST, completion_lengths)
        if self.log_sources:
            self.rewards.log(m, batch.reward_outputs)
        count_task_success(m, M.ROLLOUT_TASK_SUCCESS, self.task, batch.prompts, batch.completions)

    # 4. Optimise, 5. Adaptive KL, 6. Log ---------------------------------------------------------------------
    def optimize(self, batch: PPOBatch, gae: ops.GAEOutput) -> None:
        """num_ppo_epochs passes of shuffled mini-batches; each mini-batch accumulates its micro-batches, then one
        optimizer step. gae: the whitened advantages and the returns."""
        args, sizes, run = self.args, self.sizes, self.run
        micro = args.per_device_train_batch_size
        self.run.metrics.add_values(M.POLICY_ADVANTAGES_DIST, gae.advantages[batch.model_mask])
        for epoch in range(args.num_ppo_epochs):
            order = torch.randperm(sizes.local_batch_size, device=batch.prompt_ids.device)
            for start in range(0, sizes.local_batch_size, sizes.local_mini_batch_size):
                mini = order[start : start + sizes.local_mini_batch_size]
                # no optimizer step on this batch yet, and sampled on these weights (not stale): the sampler's weights
                fresh = epoch == 0 and start == 0 and batch.staleness == 0
                for k, micro_start in enumerate(range(0, len(mini), micro)):
                    with run.accumulating(self.model, last=k == sizes.micro_batches_per_mini_batch - 1):
                        self.micro_step(batch, gae, mini[micro_start : micro_start + micro], fresh)
                run.optimizer_step(self.model, self.optimizer)

    def adapt_kl_coef(self, kl: torch.Tensor) -> None:
        """With kl_target: the adaptive controller's step (a collective) with this update's mean sequence KL over every
        process, `kl` (B, T) this process's per-token KL."""
        if self.kl_ctl:
            self.kl_ctl.update(self.run.global_mean(kl.sum(1)), self.sizes.batch_size)

    def last_scalars(self, kl_coef: float) -> dict[str, float]:
        """What a row ending at this update logs as it stands now: the KL coefficient the update used, and the epoch
        (one episode per prompt)."""
        epoch = self.run.progress.episode / len(self.train_dataset)
        return {M.OBJECTIVE_KL_COEF.name: kl_coef, M.EPOCH.name: epoch}

    def micro_step(self, batch: PPOBatch, gae: ops.GAEOutput, idx: torch.Tensor, fresh: bool = False) -> None:
        """Forward, backward and statistics of one micro-batch (rows `idx`); `fresh`: no optimizer step on the batch
        yet, so the training log-probs are compared with the sampler's (sampling/*). A method of its own so that its
        activations are released when it returns, before the next micro-batch's forward (lower peak memory)."""
        args, m = self.args, self.run.metrics
        width = batch.prompt_ids.shape[1]
        # the losses' and metrics' tokens: the policy's own (the models read the tools' results, nothing trains them)
        mask, old_logprobs = batch.model_mask[idx], batch.old_logprobs[idx]
        self.run.count_training_tokens(batch.attention_mask[idx])  # perf/mfu: the policy's and the value model's
        stats, values = self.model(
            batch.input_ids[idx], batch.attention_mask[idx], width, batch.completion_ids[idx], args.temperature, True
        )
        new_logprobs, entropy = stats.logprobs, stats.entropy

        vpred = values[:, width - 1 : -1]
        pg = ops.clipped_policy_loss(new_logprobs, old_logprobs, gae.advantages[idx], mask, args.cliprange)
        vf = ops.clipped_value_loss(vpred, batch.values[idx], gae.returns[idx], mask, args.cliprange_value)
        pg_loss = pg.loss
        if self.generation_worker is not None:  # sampled by the worker's copy
            sampling_logprobs = batch.sampling_logprobs[idx]
            weights = off_policy_weights(m, old_logprobs, sampling_logprobs, mask, batch.staleness, args)
            if weights is not None:  # stale: TRL 1.16's importance-sampling correction of the policy term
                pg_loss = ops.masked_mean(pg.per_token_loss * weights, mask)
        loss = (pg_loss + args.vf_coef * vf.loss) / self.sizes.micro_batches_per_mini_batch
        self.accelerator.backward(loss)
        with torch.no_grad():
            tokens = mask.sum()
            ratio = pg.ratio.detach()
            m.add(M.POLICY_APPROXKL_AVG, (pg.approx_kl * mask).sum(), tokens)
            m.add(M.POLICY_POLICYKL_AVG, ((old_logprobs - new_logprobs.detach()) * mask).sum(), tokens)
            m.add(M.POLICY_CLIPFRAC_AVG, (pg.clipped & mask).sum(), tokens)
            m.add(M.POLICY_ENTROPY_AVG, (entropy * mask).sum(), tokens)
            # per_token_loss already holds the 1/2 of the value loss (ops.clipped_value_loss).
            pg_loss, vf_loss = pg.per_token_loss.double(), vf.per_token_loss.double()
            m.add_tensor(M.LOSS_POLICY_AVG, pg_loss, mask)
            m.add_tensor(M.LOSS_VALUE_AVG, vf_loss, mask)
            total = torch.where(mask, pg_loss + args.vf_coef * vf_loss, 0.0)
            self.run.add_loss(total.sum(), tokens)  # loss/total_avg, and the update's part of train_loss
            m.add(M.VAL_CLIPFRAC_AVG, (vf.clipped & mask).sum(), tokens)
            m.add_tensor(M.VAL_VPRED, vpred.detach(), mask)
            m.add(M.VAL_RATIO, (ratio * mask).sum(), tokens)
            m.add_tensor(M.VAL_RATIO_VAR, ratio, mask)
            m.add_values(M.POLICY_RATIO_DIST, ratio[mask])
            if fresh:
                log_sampling_mismatch(m, new_logprobs, batch.sampling_logprobs[idx], mask)

    # ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def evaluation(self, step: int, dataset: Dataset) -> dict[str, float]:
        """Greedy completions of the eval prompts of `dataset`: a samples table and, with a task, true success
        (returned, for the run to log). With tools, multi-turn episodes whose tools run (their tools/* metrics not
        logged), the reward functions given their messages and the table showing them as the policy read them."""
        args, tok = self.args, self.tokenizer
        metrics, table = (
            MetricAccumulator(self.eval_tool_metrics),
            [],
        )  # its own: the training window's keeps accumulating
        kept, scored = [], 0  # which scored completions are this process's own (the table's rows)
        size = args.per_device_eval_batch_size
        greedy = sampling_config(args.response_length, None, tok.pad_token_id, self.stop_ids)
        policy = attrgetter("policy")
        for part in eval_chunks(
            self.run, self.model, dataset, greedy, size, policy, episodes=self.episodes, metrics=metrics
        ):
            chunk = part.chunk
            prompt_texts = decode(tok, chunk.prompt_ids, chunk.prompt_mask)
            texts = decode(tok, chunk.completion_ids, chunk.completion_mask)
            prompts = [r[args.dataset_text_field] for r in part.rows]
            given = texts if part.messages is None else part.messages  # with tools: each episode's messages
            outputs = score_chunk(self.rewards, part.rows, prompts, given, chunk, self.state)
            kept += range(scored, scored + part.own)
            scored += len(part.rows)
            score = self.generation.final_scores(outputs, prompts, chunk.terminated)
            keep = part.own
            score, prompts, prompt_texts, texts = score[:keep], prompts[:keep], prompt_texts[:keep], texts[:keep]
            metrics.add_tensor(M.EVAL_SCORES, score)
            correct = count_task_success(metrics, M.EVAL_TASK_SUCCESS, self.task, prompts, texts)
            shown = decode(tok, chunk.completion_ids, chunk.completion_mask, skip_special_tokens=False)  # EOS shows
            sources = torch.stack([o.values for o in outputs], 1).tolist() if self.log_sources else [[]] * len(texts)
            for i, (q, text, s, raw) in enumerate(zip(prompt_texts, shown, score.tolist(), sources)):
                row = [q, text, s, *[None if v != v else v for v in raw]]  # NaN: the source did not apply
                table.append(row if correct is None else [*row, correct[i]])
        extra, logged = take_reward_logs(self.rewards, self.accelerator, prefix="eval/")  # log_extra, log_metric
        scalars = {**metrics.reduce(self.accelerator).scalars, **{k: v for k, v in logged.items() if v == v}}
        columns = ["query", "model response", "score", *(self.rewards.names if self.log_sources else [])]
        columns += ["correct"] if self.task is not None else []
        shown = min(size, 16)
        extra = {name: [values[i] for i in kept][:shown] for name, values in extra.items()}
        self.run.logger.log_table("completions", columns, table[:shown], step=step, extra_columns=extra)
        return scalars

    def generate_completions(self, sampling: bool = False) -> None:
        """TRL 1.12's name for an evaluation: greedy completions of the eval prompts, their table and scores logged at
        the step training has reached (as every --num_sample_generations evaluation is)."""
        if sampling:
            raise ConfigError(
                "generate_completions(sampling=True): rlhfkit's evaluation completes the eval prompts greedily, so "
                "that evaluations compare. Call generate_completions() (greedy)."
            )
        self.evaluate()
