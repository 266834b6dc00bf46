"""PPO's generation (docs/algorithms/ppo.md, step 1): the next batch of prompts completed by the policy (or taken
from the generation worker), with the log-probs, reference log-probs and values the update needs, scored by every reward
source, the EOS trick applied. `PPOGeneration` takes its collaborators explicitly: the run, the models, the reward
sources, the sampler, the dataset."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit.agents.episodes import sample_episodes
from rlhfkit.config import PPOConfig
from rlhfkit.config.batch_sizes import PPOBatchSizes
from rlhfkit.models import adapter_disabled, completion_token_stats, token_values
from rlhfkit.rewards import RewardOutput, RewardSources, apply_eos_trick
from rlhfkit.sampling import Chunk, cat_padded, complete, decode, model_pad_id
from rlhfkit.trainers.generation_worker import Generation
from rlhfkit.trainers.ppo.model import PolicyAndValue
from rlhfkit.trainers.run import TrainingRun
from rlhfkit.trainers.sampler import Sampler
from rlhfkit.trainers.scoring import score_chunk, take_reward_logs


@dataclass
class PPOBatch:
    """One update's completions on this process, scored: the sampler's Chunk fields (sampling/completions.py), then
    what generation adds. B completions, Lp prompt width, T completion width. The per-token tensors are 0 outside
    model_mask."""

    prompt_ids: torch.Tensor  # (B, Lp) long, left-padded
    prompt_mask: torch.Tensor  # (B, Lp) bool
    completion_ids: torch.Tensor  # (B, T) long, right-padded
    completion_mask: torch.Tensor  # (B, T) bool, True up to and including the terminator: what the models read
    # (B, T) bool, the tokens the policy sampled: completion_mask, without the tool results between an episode's
    # turns (tools=); the steps of the KL, GAE, the losses and every per-token metric
    model_mask: torch.Tensor
    terminated: torch.Tensor  # (B,) bool
    sampling_logprobs: torch.Tensor  # (B, T) the sampler's log-probs of the same tokens (old_logprobs, where exact)
    old_logprobs: torch.Tensor  # (B, T) logp_old: the policy's log-probs at generation (temperature-scaled)
    ref_logprobs: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T) value predictions at generation time
    scores: torch.Tensor  # (B,) weighted sum of the reward sources, after the EOS trick
    reward_outputs: list[RewardOutput]  # each reward source's raw values (functions, then the reward model)
    prompts: list  # the dataset's prompts (text, or lists of messages)
    completions: list[str]  # with tools: each episode as the policy read it, special tokens kept
    staleness: int = 0  # updates between the weights that sampled it and those it trains (async_generation)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)


class PPOGeneration:
    """The generations of a PPO run. model: the prepared PolicyAndValue; ref_model: the prepared frozen reference, or
    None with LoRA (the policy with its adapter disabled); reuse_sampling_logprobs: the sampler's log-probs are exact
    on these weights (TrainingRun.sampling_logprobs_exact), so a fresh batch takes them as logp_old."""

    def __init__(
        self,
        args: PPOConfig,
        sizes: PPOBatchSizes,
        run: TrainingRun,
        model: nn.Module,
        ref_model: nn.Module | None,
        rewards: RewardSources,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        train_dataset: Dataset,
        reuse_sampling_logprobs: bool,
    ):
        self.args, self.sizes, self.run = args, sizes, run
        self.model, self.ref_model = model, ref_model
        self.rewards, self.sampler = rewards, sampler
        self.tokenizer, self.train_dataset = tokenizer, train_dataset
        self.reuse_sampling_logprobs = reuse_sampling_logprobs

    def generate(self, prompts: Iterator[list[int]]) -> PPOBatch:
        """The next batch of prompts (this process's rows), completed and scored: by the policy itself, or by the
        generation worker (async_generation: asked for up to max_staleness updates ahead, each on the weights of its
        time; the batch keeps its staleness, which micro_step corrects for). Its episodes count as generated."""
        if self.sampler.worker is None:
            batch = self.generate_and_score([self.train_dataset[i] for i in next(prompts)])
        else:
            size = self.args.local_rollout_forward_batch_size

            def ask():
                return [self.train_dataset[i] for i in next(prompts)], size

            generation = self.sampler.worker.next_generation(self.run, ask)
            batch = self.generate_and_score(generation.rows, generation)
        self.run.progress.episode += self.sizes.batch_size
        return batch

    @torch.inference_mode()
    def generate_and_score(self, rows: list[dict], sampled: Generation | None = None) -> PPOBatch:
        """Complete the prompts of `rows`, with log-probs, reference log-probs and values, in chunks of
        local_rollout_forward_batch_size; then score the completions.

        rows: the dataset rows (their prompts are what the task checker and the reward functions read; the prompt
        tokens, which may have been truncated, are what the model saw). sampled: the generation when the worker
        sampled it (async_generation: its chunks, with tools its episodes' messages, and its staleness); the log-probs
        are then the current policy's, from a forward, unless the worker sampled with these very weights."""
        args, tok, device = self.args, self.tokenizer, self.run.accelerator.device
        config = self.sampler.config(args.response_length)
        staleness = 0 if sampled is None else sampled.staleness
        reuse_sampling_logprobs = self.reuse_sampling_logprobs and staleness == 0
        fields = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "terminated", "sampling_logprobs")
        parts: dict[str, list] = {k: [] for k in (*fields, "model_mask", "old_logprobs", "ref_logprobs", "values")}
        prompt_token_ids, size = [r["input_ids"] for r in rows], args.local_rollout_forward_batch_size
        messages = None  # with tools: each episode's messages, what the reward functions get
        with self.run.gathered(self.model) as model:  # whole weights while sampling (ZeRO-3, FSDP)
            model.eval()
            if sampled is not None:
                chunks, messages = sampled.chunks, sampled.messages
            elif self.sampler.episodes is not None:  # multi-turn, with tools
                episodes, _ = sample_episodes(
                    self.sampler.episodes, model.policy, rows, config, size, device, self.run.metrics
                )
                chunks = [e.chunk for e in episodes]
                messages = [m for e in episodes for m in e.messages]
            else:
                chunks = complete(model.policy, prompt_token_ids, config, size, device)
            for chunk in chunks:
                ids, mask, width = chunk.input_ids, chunk.attention_mask, chunk.prompt_ids.shape[1]
                if reuse_sampling_logprobs:
                    old_logprobs = chunk.sampling_logprobs
                    values = token_values(model.value_model, ids, mask)
                else:
                    stats, values = model(ids, mask, width, chunk.completion_ids, args.temperature)
                    old_logprobs = stats.logprobs
                parts["old_logprobs"].append(old_logprobs)
                parts["ref_logprobs"].append(self.reference_logprobs(model, ids, mask, width, chunk.completion_ids))
                parts["values"].append(values[:, width - 1 : -1])
                parts["model_mask"].append(chunk.model_mask)
                for key in fields:
                    parts[key].append(getattr(chunk, key))
            model.train()
            pad = model_pad_id(model.policy, tok.pad_token_id)  # TRL's [PAD] may lie beyond the embeddings
        # Chunks can differ in width: prompts are padded again on the left, completions on the right.
        prompt_ids = cat_padded(parts["prompt_ids"], pad, left=True)
        prompt_mask = cat_padded(parts["prompt_mask"], False, left=True)
        completion_ids = cat_padded(parts["completion_ids"], pad)
        completion_mask = cat_padded(parts["completion_mask"], False)
        model_mask = cat_padded(parts["model_mask"], False)
        terminated = torch.cat(parts["terminated"])
        prompts = [r[args.dataset_text_field] for r in rows]
        # An episode with tools as the policy read it, special tokens kept (its turns, calls and the tools' results)
        completions = decode(tok, completion_ids, completion_mask, skip_special_tokens=messages is None)
        scored = completions if messages is None else messages  # TRL's form: the reward functions get the messages
        completion_chunk = Chunk(prompt_ids, prompt_mask, completion_ids, completion_mask, terminated, None)
        outputs = score_chunk(self.rewards, rows, prompts, scored, completion_chunk, self.run.callbacks.state)
        _, logged_metrics = take_reward_logs(self.rewards, self.run.accelerator)  # log_metric (a collective)
        self.run.reward_metrics.add(logged_metrics)
        return PPOBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            model_mask=model_mask,
            terminated=terminated,
            sampling_logprobs=cat_padded(parts["sampling_logprobs"], 0.0) * model_mask,
            old_logprobs=cat_padded(parts["old_logprobs"], 0.0) * model_mask,
            ref_logprobs=cat_padded(parts["ref_logprobs"], 0.0) * model_mask,
            values=cat_padded(parts["values"], 0.0) * model_mask,
            scores=self.final_scores(outputs, prompts, terminated),
            reward_outputs=outputs,
            prompts=prompts,
            completions=completions,
            staleness=staleness,
        )

    def final_scores(self, outputs: list[RewardOutput], prompts: list, terminated: torch.Tensor) -> torch.Tensor:
        """(B,) float32 scores: the weighted sum of the reward sources' values, then the EOS trick."""
        args = self.args
        total = self.rewards.total(outputs, prompts).to(terminated.device, torch.float32)
        return apply_eos_trick(
            total, terminated, args.missing_eos_penalty, args.non_eos_penalty, args.penalty_reward_value
        )

    def reference_logprobs(
        self, model: PolicyAndValue, input_ids, attention_mask, prompt_width: int, completion_ids
    ) -> torch.Tensor:
        """(B, T) log-probs of the completion tokens under the reference: the frozen copy, or with LoRA the policy
        (of `model`, the unwrapped policy and value model) with its adapter disabled."""
        args = (input_ids, attention_mask, prompt_width, completion_ids, self.args.temperature)
        packed = self.args.padding_free
        if self.ref_model is not None:
            return completion_token_stats(self.ref_model, *args, padding_free=packed).logprobs
        with adapter_disabled(model.policy) as base:
            return completion_token_stats(base, *args, padding_free=packed).logprobs
