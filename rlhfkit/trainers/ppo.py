"""PPO for language models with a learned value model and a per-token KL penalty to a frozen reference.

Variant: "The N+ Implementation Details of RLHF with PPO" (Huang et al., 2024), the design behind TRL's
PPOv2 trainer, itself following Ziegler et al. (2019) and Stiennon et al. (2020):

* reward_t = -kl_coef * KL_t(policy || reference) on every response token, plus the score on the last real
  response token: the reward model's, or with reward functions (verifiable rewards, as verl and OpenRLHF offer)
  the weighted sum of the functions' and the reward model's; optional EOS trick (non_eos_penalty /
  missing_eos_penalty);
* GAE(gamma, lam) over response tokens with the value model (initialised from the reward model, else from the
  policy's weights with a zero score head); advantages whitened over the rollout batch;
* clipped policy surrogate and clipped value loss; num_ppo_epochs x num_mini_batches optimizer steps per
  rollout batch, each mini-batch accumulated from per_device_train_batch_size micro-batches;
* learning rate decayed linearly to 0 over the updates (--lr_scheduler_type: transformers' schedules, stepped once
  per update as TRL does); optional adaptive KL controller (Ziegler et al.).

Deviations from TRL's trainer, each deliberate (docs/algorithms/ppo.md gives the details):
* the score is added on the last real response token, not on the first padding position after it (TRL #3750);
* every per-token statistic is a masked mean over real response tokens, pooled over micro-batches and
  processes (no sentinel values leak into objective/entropy, val/ratio or policy/approxkl_avg);
* one optimizer step per mini-batch (TRL steps once per gradient_accumulation_steps micro-batches).

LoRA (--use_peft): the policy and the value model train adapters (the value model's score head in full); the
reference is the policy with its adapter disabled, not a copy (add_adapters, reference_logits).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit import ops
from rlhfkit.checkpoint import load_weights
from rlhfkit.config import ConfigError, PPOConfig, ppo_batch_sizes
from rlhfkit.data import endless_batches, tokenize_prompts
from rlhfkit.engines import substate
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import (
    Hub,
    adapter_disabled,
    disable_dropout,
    enable_gradient_checkpointing,
    frozen_copy,
    no_split_modules,
    response_logits,
    token_values,
    value_model_from_policy,
    weight_dtype,
    with_lora,
    write_merged,
)
from rlhfkit.rewards import (
    RewardModelFunction,
    RewardOutput,
    RewardSources,
    apply_eos_trick,
    reward_name,
    reward_sources,
)
from rlhfkit.rollout import (
    complete,
    decode,
    greedy_completions,
    pad_right,
    sampling_config,
    terminator_ids,
)
from rlhfkit.trainers.common import epoch_end_steps, make_optimizer
from rlhfkit.trainers.run import TrainingRun


class PolicyAndValue(nn.Module):
    """Policy and value model behind one forward, so one DDP wrapper synchronises both gradients (and one DeepSpeed
    or FSDP engine shards both: its layers are the two models' transformer layers)."""

    def __init__(self, policy: nn.Module, value_model: nn.Module):
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self._no_split_modules = no_split_modules(policy) + no_split_modules(value_model)
        self.config = policy.config  # what DeepSpeed's "auto" bucket sizes read (hidden_size)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, query_width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, V) logits predicting the response tokens and (B, L) values at every position."""
        logits = response_logits(self.policy, input_ids, attention_mask, query_width)
        return logits, token_values(self.value_model, input_ids, attention_mask)


@dataclass
class RolloutBatch:
    """One update's rollouts on this process. B rollouts, Lq query width, T response width."""

    query_ids: torch.Tensor  # (B, Lq) long, left-padded
    query_mask: torch.Tensor  # (B, Lq) bool
    response_ids: torch.Tensor  # (B, T) long, right-padded
    response_mask: torch.Tensor  # (B, T) bool, True up to and including the terminator
    terminated: torch.Tensor  # (B,) bool
    logprobs: torch.Tensor  # (B, T) policy log-probs at rollout time (temperature-scaled)
    ref_logprobs: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T) value predictions at rollout time
    scores: torch.Tensor  # (B,) weighted sum of the reward sources, after the EOS trick
    reward_outputs: list[RewardOutput]  # each reward source's raw values (functions, then the reward model)
    queries: list[str]  # decoded query tokens (what the policy saw)
    prompts: list  # the dataset's prompts (text, or lists of messages)
    responses: list[str]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.response_mask], dim=1)


class PPOTrainer:
    """PPO trainer; see the module docstring for the exact variant. ``train()`` runs the whole loop.

    TRL's arguments, plus: reward_model optional when reward_funcs are given; reward_funcs: one or a list of
    callables ``f(prompts, completions, **columns) -> list[float | None]``, reward-model paths or sequence-
    classification models with their own tokenizer (as GRPOTrainer takes them), scored beside reward_model and
    weighted by args.reward_weights (functions, then reward_model); reward_processing_classes: the tokenizers of
    reward models given in reward_funcs as modules. value_model: default a copy of reward_model, else the policy's
    weights with a zero score head (models.value_model_from_policy). task: a built-in ``Task`` whose checker measures
    true success.
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
        eval_dataset: Dataset | None = None,
        task=None,
        reward_funcs: Callable | str | nn.Module | Sequence[Callable | str | nn.Module] | None = None,
        reward_processing_classes: Sequence[PreTrainedTokenizerBase | None] | None = None,
    ):
        if train_dataset is None:
            raise ConfigError("PPOTrainer needs a train_dataset with a prompt column.")
        if reward_model is None and reward_funcs is None:
            raise ConfigError(
                "PPOTrainer needs a reward: pass reward_model (a sequence-classification model with the policy's "
                "vocabulary) and/or reward_funcs (functions f(prompts, completions, **columns) -> list[float])."
            )
        self.args = args
        self.run = run = TrainingRun(args)  # output_dir, trackers, checkpoint to resume: read, nothing written yet
        self.accelerator = acc = run.accelerator
        self.tokenizer = processing_class
        self.task = task
        self.stop_ids = terminator_ids(processing_class, model, args.stop_token_id)

        text, limit, overflow = args.dataset_text_field, args.max_prompt_length, args.prompt_overflow
        procs = args.dataset_num_proc
        self.train_dataset = tokenize_prompts(
            train_dataset, processing_class, text, limit, "", overflow, num_proc=procs
        )
        self.eval_dataset = (
            tokenize_prompts(eval_dataset, processing_class, text, limit, "eval ", overflow, num_proc=procs)
            if eval_dataset is not None
            else None
        )
        self.sizes = ppo_batch_sizes(args, acc.num_processes, len(self.train_dataset))

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
        if args.gradient_checkpointing:
            for m in (model, value_model):
                enable_gradient_checkpointing(m, args.gradient_checkpointing_kwargs)
        wrapper = PolicyAndValue(model, value_model)
        optimizer = make_optimizer([p for p in wrapper.parameters() if p.requires_grad], args, acc.device)
        self.model, self.optimizer = acc.prepare(wrapper, optimizer)
        # Where exact (run.sampling_logprobs_exact), the rollout skips the policy forward; PPO's first ratio is then
        # 1 up to fp32 rounding. Elsewhere a full forward recomputes them, as the update will see them.
        self.reuse_sampling_logprobs = run.sampling_logprobs_exact(model)
        self.kl_ctl = (
            ops.AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon) if args.kl_target else None
        )
        num_updates = self.sizes.num_total_batches
        epoch_ends = epoch_end_steps(num_updates, len(self.train_dataset), self.sizes.batch_size)
        # Per-source rewards/<name>/mean|std only with reward functions: a reward model alone logs TRL's keys alone.
        self.log_sources = reward_funcs is not None
        extra_metrics = [m for pair in self.rewards.metrics for m in pair] if self.log_sources else []
        run.start(self, num_updates, extra_metrics, unit="update", epoch_ends=epoch_ends)  # restores a checkpoint

    # What the run lifecycle needs from its trainer: models, own state, evaluation.
    def write_models(self, directory: str, state_dict: dict | None = None) -> None:
        """Policy (loadable on its own), value model in value_model/, and the tokenizer. With --use_peft, peft's
        save_pretrained writes the adapters (adapter_config.json, adapter_model.safetensors), not the base weights.
        state_dict: the full weights gathered from a sharding engine (TrainingRun), else None (the models' own)."""
        model = self.unwrapped
        model.policy.save_pretrained(directory, state_dict=substate(state_dict, "policy."))
        value_dir = os.path.join(directory, "value_model")
        model.value_model.save_pretrained(value_dir, state_dict=substate(state_dict, "value_model."))
        self.tokenizer.save_pretrained(directory)

    def load_models(self, directory, trained: bool = True) -> None:
        """The policy and value model of a checkpoint (trained: False when the engine restored them itself)."""
        if trained:
            load_weights(self.unwrapped.policy, directory)
            load_weights(self.unwrapped.value_model, os.path.join(directory, "value_model"))

    def reward_sources(self, reward_funcs, processing_classes, reward_model: nn.Module | None) -> RewardSources:
        """The reward functions (and reward models with their own tokenizer) given in reward_funcs, then the reward
        model, which reads the policy's tokenizer and scores its token ids in chunks of
        local_rollout_forward_batch_size, as TRL's PPO does."""
        args, acc = self.args, self.accelerator
        names, funcs = [], []
        if reward_funcs is not None:
            dtype, hub = weight_dtype(args.dtype), Hub.from_args(args)
            names, funcs = reward_sources(reward_funcs, processing_classes, self.tokenizer, dtype, acc.device, hub)
        if reward_model is not None:
            name, size = reward_name(reward_model), args.local_rollout_forward_batch_size
            names.append(name)
            funcs.append(RewardModelFunction(reward_model, self.tokenizer, name, True, size, policy_tokens=True))
        return RewardSources(names, funcs, args.reward_weights)

    # LoRA (--use_peft): adapters, the reference as the adapter-disabled policy, the merged save.
    def add_adapters(self, model: nn.Module, ref_model, value_model) -> tuple[nn.Module, nn.Module]:
        """The policy and the value model with LoRA adapters (models.with_lora); their base weights stay frozen.

        The value model (by default a copy of the reward model) gets its own adapter with peft's task type SEQ_CLS,
        whose score head peft trains in full: a fresh value head must learn the returns' scale, which a low-rank
        update of the backbone alone would not give it. There is no reference model: it is the policy with its
        adapter disabled (reference_logits)."""
        if ref_model is not None:
            raise ConfigError(
                "PPOTrainer got a ref_model and use_peft: with LoRA the reference is the policy with its adapter "
                "disabled. Pass ref_model=None."
            )
        return with_lora(model, self.args), with_lora(value_model, self.args, task_type="SEQ_CLS")

    def reference_logits(self, model: PolicyAndValue, input_ids, attention_mask, query_width: int) -> torch.Tensor:
        """(B, T, V) logits of the reference predicting the response tokens: the frozen copy, or with LoRA the policy
        (of `model`, the unwrapped policy and value model) with its adapter disabled."""
        if self.ref_model is not None:
            return response_logits(self.ref_model, input_ids, attention_mask, query_width)
        with adapter_disabled(model.policy) as base:
            return response_logits(base, input_ids, attention_mask, query_width)

    def save_merged(self) -> None:
        """--merge_adapter: output_dir/merged/, the policy with its adapter merged (a plain transformers model).
        Called when the run has ended (its process group too): the main process writes it alone."""
        if self.accelerator.is_main_process:
            write_merged(self.unwrapped.policy, self.tokenizer, os.path.join(self.args.output_dir, "merged"))

    def state_dict(self) -> dict:
        return {"kl_ctl": self.kl_ctl.state_dict()} if self.kl_ctl is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.kl_ctl is not None:
            self.kl_ctl.load_state_dict(state["kl_ctl"])

    @property
    def unwrapped(self) -> PolicyAndValue:
        return self.accelerator.unwrap_model(self.model)

    @property
    def kl_coef(self) -> float:
        return self.kl_ctl.value if self.kl_ctl else self.args.kl_coef

    # ------------------------------------------------------------------------------------------------
    def train(self) -> None:
        args, sizes, run, acc = self.args, self.sizes, self.run, self.accelerator
        prompts = endless_batches(
            len(self.train_dataset),
            sizes.local_batch_size,
            args.seed,
            acc.process_index,
            acc.num_processes,
            skip=run.progress.step,  # one batch per update
            shuffle=args.shuffle_dataset,
        )
        for update in run.steps():
            # 1. Rollout: sample responses to a batch of prompts from the current policy, score them.
            rows = [self.train_dataset[i] for i in next(prompts)]
            with run.timed(M.TIME_ROLLOUT):
                batch = self.rollout(rows)

            # 2. Rewards: per-token KL penalty to the reference, score on the last real response token.
            mask = batch.response_mask
            kl = ops.kl_per_token(batch.logprobs, batch.ref_logprobs, args.kl_estimator) * mask
            shaped = ops.kl_penalized_rewards(batch.scores, kl, mask, self.kl_coef)
            rewards = shaped.rewards
            if args.whiten_rewards:
                rewards = ops.masked_whiten(rewards, mask, keep_mean=True)

            # 3. Advantages: GAE over response tokens, then whitened over the rollout batch.
            gae = ops.gae(rewards, batch.values, mask, args.gamma, args.lam)
            advantages = ops.masked_whiten(gae.advantages, mask)
            self.log_rollout(batch, kl, shaped.non_score_reward, gae)

            # 4. Optimise: num_ppo_epochs passes of shuffled mini-batches, one optimizer step per mini-batch.
            with run.timed(M.TIME_OPTIMIZATION):
                self.optimize(batch, advantages, gae.returns)
            run.progress.episode += sizes.batch_size

            # 5. Adapt the KL coefficient towards kl_target with this update's KL (Ziegler et al. 2019), if enabled.
            kl_coef_used = self.kl_coef
            if self.kl_ctl:
                self.kl_ctl.update(run.global_mean(kl.sum(1)), sizes.batch_size)

            # 6. Log the window, health checks, evaluation and checkpoints on schedule; stop early if asked.
            epoch = run.progress.episode / len(self.train_dataset)  # one episode per prompt
            run.end_step(update, {M.OBJECTIVE_KL_COEF.name: kl_coef_used, M.EPOCH.name: epoch})
        if args.merge_adapter:  # after the final checkpoint and save, which keep the adapter
            self.save_merged()

    # ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def rollout(self, rows: list[dict]) -> RolloutBatch:
        """Generate, with log-probs and values, in chunks of local_rollout_forward_batch_size; then score the batch.

        rows: the dataset rows (their prompts are what the task checker and the reward functions read; queries are
        what the model saw)."""
        args, tok, device = self.args, self.tokenizer, self.accelerator.device
        gen_config = sampling_config(args.response_length, args.temperature, tok.pad_token_id, self.stop_ids)
        parts: dict[str, list] = {k: [] for k in ("q", "qm", "r", "rm", "term", "logp", "ref", "val")}
        step = args.local_rollout_forward_batch_size
        prompt_ids = [r["input_ids"] for r in rows]
        with self.run.gathered(self.model) as model:  # whole weights while sampling (ZeRO-3, FSDP)
            model.eval()
            chunks = complete(model.policy, prompt_ids, gen_config, self.stop_ids, tok.pad_token_id, step, device)
            for chunk in chunks:
                query_ids, query_mask, resp, logprobs = chunk
                ids, attn = chunk.input_ids, chunk.attention_mask
                width = query_ids.shape[1]
                if self.reuse_sampling_logprobs:
                    values = token_values(model.value_model, ids, attn)
                else:
                    logits, values = model(ids, attn, width)
                    logprobs = ops.logprobs_from_logits(logits, resp.ids, args.temperature)
                parts["logp"].append(logprobs)
                ref_logits = self.reference_logits(model, ids, attn, width)
                parts["ref"].append(ops.logprobs_from_logits(ref_logits, resp.ids, args.temperature))
                parts["val"].append(values[:, width - 1 : -1])
                for key, value in (
                    ("q", query_ids),
                    ("qm", query_mask),
                    ("r", resp.ids),
                    ("rm", resp.mask),
                    ("term", resp.terminated),
                ):
                    parts[key].append(value)
            model.train()
        # Chunks can differ in width: queries are re-padded on the left, responses on the right.
        q_width = max(q.shape[1] for q in parts["q"])
        query_ids = torch.cat(
            [nn.functional.pad(q, (q_width - q.shape[1], 0), value=tok.pad_token_id) for q in parts["q"]]
        )
        query_mask = torch.cat([nn.functional.pad(q, (q_width - q.shape[1], 0), value=False) for q in parts["qm"]])
        response_ids, response_mask = pad_right(parts["r"], tok.pad_token_id), pad_right(parts["rm"], False)
        terminated = torch.cat(parts["term"])
        prompts, responses = [r[args.dataset_text_field] for r in rows], decode(tok, response_ids, response_mask)
        sequence = (torch.cat([query_ids, response_ids], 1), torch.cat([query_mask, response_mask], 1))
        outputs, scores = self.score(rows, prompts, responses, sequence, (response_ids, response_mask), terminated)
        return RolloutBatch(
            query_ids=query_ids,
            query_mask=query_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            terminated=terminated,
            logprobs=pad_right(parts["logp"], 0.0) * response_mask,
            ref_logprobs=pad_right(parts["ref"], 0.0) * response_mask,
            values=pad_right(parts["val"], 0.0) * response_mask,
            scores=scores,
            reward_outputs=outputs,
            queries=decode(tok, query_ids, query_mask),
            prompts=prompts,
            responses=responses,
        )

    def score(
        self, rows, prompts, responses, sequence, response, terminated
    ) -> tuple[list[RewardOutput], torch.Tensor]:
        """Each reward source's raw values, and the (B,) score: their weighted sum, then the EOS trick.

        sequence: (ids, mask) of query + response in the policy's tokens; response: (ids, mask) of the responses."""
        args = self.args
        outputs = self.rewards.score(rows, prompts, responses, sequence, response, args.dataset_text_field)
        total = self.rewards.total(outputs, prompts).to(terminated.device, torch.float32)
        scores = apply_eos_trick(
            total, terminated, args.missing_eos_penalty, args.non_eos_penalty, args.penalty_reward_value
        )
        return outputs, scores

    def log_rollout(self, batch: RolloutBatch, kl: torch.Tensor, non_score_reward: torch.Tensor, gae) -> None:
        """Rollout statistics, pooled over processes when reduced."""
        m, mask = self.run.metrics, batch.response_mask
        n = len(batch.scores)
        seq_kl, seq_nsr = kl.sum(1), non_score_reward.sum(1)
        m.add(M.OBJECTIVE_KL, seq_kl.sum(), n)
        m.add(M.OBJECTIVE_ENTROPY, (-batch.logprobs * mask).sum(), n)
        m.add(M.OBJECTIVE_NON_SCORE_REWARD, seq_nsr.sum(), n)
        m.add(M.OBJECTIVE_SCORES, batch.scores.sum(), n)
        m.add_tensor(M.OBJECTIVE_SCORES_STD, batch.scores)
        m.add(M.OBJECTIVE_RLHF_REWARD, (batch.scores + seq_nsr).sum(), n)
        m.add(M.VAL_NUM_EOS_TOKENS, batch.terminated.sum())
        tokens = mask.sum()
        m.add(M.VAL_MEAN, (batch.values * mask).sum(), tokens)
        m.add_tensor(M.VAL_VAR, batch.values, mask)
        m.add(M.VAL_ERROR, ((batch.values - gae.returns) ** 2 * mask).sum(), tokens)
        m.add(M.VAL_VAR_EXPLAINED, ops.explained_variance(batch.values, gae.returns, mask), 1)
        m.add(M.RETURNS_MEAN, (gae.returns * mask).sum(), tokens)
        m.add_tensor(M.RETURNS_VAR, gae.returns, mask)
        m.add(M.POLICY_ADVANTAGES_MEAN, (gae.advantages * mask).sum(), tokens)
        q_len, r_len = batch.query_mask.sum(1).double(), mask.sum(1).double()
        m.add(M.TOKENS_QUERIES_LEN_MEAN, q_len.sum(), n)
        m.add_tensor(M.TOKENS_QUERIES_LEN_STD, q_len)
        m.add(M.TOKENS_RESPONSES_LEN_MEAN, r_len.sum(), n)
        m.add_tensor(M.TOKENS_RESPONSES_LEN_STD, r_len)
        m.add_values(M.ENV_REWARD_DIST, batch.scores)
        m.add_values(M.OBJECTIVE_KL_DIST, seq_kl)
        m.add_values(M.OBJECTIVE_LOGPROBS, batch.logprobs[mask])
        m.add_values(M.OBJECTIVE_REF_LOGPROBS, batch.ref_logprobs[mask])
        m.add_values(M.TOKENS_QUERIES_DIST, q_len)
        m.add_values(M.TOKENS_RESPONSES_DIST, r_len)
        if self.log_sources:
            self.rewards.log(m, batch.reward_outputs)
        if self.task is not None:
            correct = [self.task.check(p, r) for p, r in zip(batch.prompts, batch.responses)]
            m.add(M.ROLLOUT_TASK_SUCCESS, float(sum(correct)), len(correct))

    def optimize(self, batch: RolloutBatch, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        """num_ppo_epochs passes of shuffled mini-batches; each mini-batch accumulates its micro-batches, then one
        optimizer step."""
        args, sizes, run = self.args, self.sizes, self.run
        micro = args.per_device_train_batch_size
        self.run.metrics.add_values(M.POLICY_ADVANTAGES_DIST, advantages[batch.response_mask])
        for _ in range(args.num_ppo_epochs):
            order = torch.randperm(sizes.local_batch_size, device=batch.query_ids.device)
            for start in range(0, sizes.local_batch_size, sizes.local_mini_batch_size):
                mini = order[start : start + sizes.local_mini_batch_size]
                for k, micro_start in enumerate(range(0, len(mini), micro)):
                    with run.accumulating(self.model, last=k == sizes.micro_batches_per_mini_batch - 1):
                        self.micro_step(batch, advantages, returns, mini[micro_start : micro_start + micro])
                run.optimizer_step(self.model, self.optimizer)

    def micro_step(self, batch: RolloutBatch, advantages, returns, idx: torch.Tensor) -> None:
        """Forward, backward and statistics of one micro-batch (rows `idx`). A method of its own so that its
        activations are released when it returns, before the next micro-batch's forward (lower peak memory)."""
        args, m = self.args, self.run.metrics
        width = batch.query_ids.shape[1]
        mask = batch.response_mask[idx]
        logits, values = self.model(batch.input_ids[idx], batch.attention_mask[idx], width)
        new_logprobs = ops.logprobs_from_logits(logits, batch.response_ids[idx], args.temperature)
        vpred = values[:, width - 1 : -1]
        pg = ops.clipped_policy_loss(new_logprobs, batch.logprobs[idx], advantages[idx], mask, args.cliprange)
        vf = ops.clipped_value_loss(vpred, batch.values[idx], returns[idx], mask, args.cliprange_value)
        loss = (pg.loss + args.vf_coef * vf.loss) / self.sizes.micro_batches_per_mini_batch
        self.accelerator.backward(loss)
        with torch.no_grad():
            entropy = ops.entropy_from_logits(logits.detach(), args.temperature)
            tokens = mask.sum()
            ratio = pg.ratio.detach()
            m.add(M.POLICY_APPROXKL_AVG, (pg.approx_kl * mask).sum(), tokens)
            m.add(M.POLICY_POLICYKL_AVG, ((batch.logprobs[idx] - new_logprobs.detach()) * mask).sum(), tokens)
            m.add(M.POLICY_CLIPFRAC_AVG, (pg.clipped & mask).sum(), tokens)
            m.add(M.POLICY_ENTROPY_AVG, (entropy * mask).sum(), tokens)
            # per_token_loss already holds the 1/2 of the value loss (ops.clipped_value_loss).
            pg_loss, vf_loss = pg.per_token_loss.double(), vf.per_token_loss.double()
            m.add_tensor(M.LOSS_POLICY_AVG, pg_loss, mask)
            m.add_tensor(M.LOSS_VALUE_AVG, vf_loss, mask)
            m.add_tensor(M.LOSS_TOTAL_AVG, pg_loss + args.vf_coef * vf_loss, mask)
            m.add(M.VAL_CLIPFRAC_AVG, (vf.clipped & mask).sum(), tokens)
            m.add_tensor(M.VAL_VPRED, vpred.detach(), mask)
            m.add(M.VAL_RATIO, (ratio * mask).sum(), tokens)
            m.add_tensor(M.VAL_RATIO_VAR, ratio, mask)
            m.add_values(M.POLICY_RATIO_DIST, ratio[mask])

    # ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def evaluate(self, step: int) -> None:
        """Greedy completions on the eval prompts: a samples table and, with a task, true success."""
        args, acc, tok = self.args, self.accelerator, self.tokenizer
        metrics, table = MetricAccumulator(), []  # its own: the training window's metrics keep accumulating
        size = args.per_device_eval_batch_size
        rows, own = self.run.local_rows(self.eval_dataset)  # rows[own:]: lockstep padding, left out below
        with self.run.gathered(self.model) as model:
            model.eval()
            chunks = list(
                greedy_completions(model.policy, rows, tok, self.stop_ids, args.response_length, size, acc.device)
            )
            model.train()
        for start, (part, chunk) in zip(range(0, len(rows), size), chunks):
            resp = chunk.responses
            queries, responses = decode(tok, chunk.query_ids, chunk.query_mask), decode(tok, resp.ids, resp.mask)
            prompts = [r[args.dataset_text_field] for r in part]
            sequence = (chunk.input_ids, chunk.attention_mask)
            outputs, score = self.score(part, prompts, responses, sequence, (resp.ids, resp.mask), resp.terminated)
            keep = max(0, min(len(part), own - start))  # this chunk's own rows
            score, prompts, queries, responses = score[:keep], prompts[:keep], queries[:keep], responses[:keep]
            metrics.add_tensor(M.EVAL_SCORES, score)
            shown = decode(tok, resp.ids, resp.mask, skip_special_tokens=False)  # a missing EOS stays visible
            sources = torch.stack([o.values for o in outputs], 1).tolist() if self.log_sources else [[]] * len(part)
            for prompt, q, r, text, s, raw in zip(prompts, queries, responses, shown, score.tolist(), sources):
                row = [q, text, s, *[None if v != v else v for v in raw]]  # NaN: the source did not apply
                if self.task is not None:
                    correct = self.task.check(prompt, r)  # the dataset's prompt: the query may have been truncated
                    metrics.add(M.EVAL_TASK_SUCCESS, float(correct), 1)
                    row.append(correct)
                table.append(row)
        logger = self.run.logger
        logger.log(metrics.reduce(acc).scalars, step=step)
        columns = ["query", "model response", "score", *(self.rewards.names if self.log_sources else [])]
        columns += ["correct"] if self.task is not None else []
        logger.log_table("completions", columns, table[: min(size, 16)], step=step)
