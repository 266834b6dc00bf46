"""GRPO's generation: from the prompts' indices to the batch the loss trains on (docs/algorithms/grpo.md, steps 1-4).

Whenever the last generation has served its micro-batches, `GRPOGeneration.micro_batches` makes the next one:

1. **Generate**: each prompt of the generation batch G times, this process's share of the completions, sampled by
   the policy's own weights (`sample_round`), or taken from the generation worker (`receive`, --async_generation);
2. **Rewards**: every reward source scores them, gathered across processes so a group spanning processes is one
   group (`score_round`); --dynamic_sampling draws further rounds of prompts until the batch is full of groups with
   reward spread (`generate_and_score`, ops.select_groups) and merges the kept groups (`merge_rounds`);
3. **Advantages** over the whole batch, the loss mask (`batch_of`);
4. **Old and reference log-probs**, where the loss needs them (`batch_of`).

Three types carry a generation on every path: the sampler's `Chunk` (sampling/completions.py: token ids, masks, the
sampler's log-probs), a `ScoredRound` (one round's chunk with its texts and rewards) and the `GRPOBatch` the loss
trains on.

With --async_generation the generation is off-policy: the worker samples with a copy of the policy up to
max_staleness optimizer steps older than the weights the batch trains (the batch's `staleness`); the loss keeps
GRPO's ratio to logp_old (the trainer's log-probs of the batch) and, for a stale batch, multiplies each token's loss
by TRL 1.16's truncated or masked importance weight pi_old / pi_behaviour (offpolicy.off_policy_weights, in
GRPOTrainer.micro_step).

With tools (GRPOTrainer(tools=[...])) a round's completions are multi-turn episodes (agents.episodes.ToolEpisodes: the
policy's turns and the tools' results between them); the chunk's tool_mask keeps the tool results out of the loss mask
and the completion lengths, and the reward functions get each episode's messages, as in TRL.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit import ops
from rlhfkit.agents.episodes import CustomRollout, sample_episodes
from rlhfkit.config import GRPOConfig
from rlhfkit.config.batch_sizes import GRPOBatchSizes
from rlhfkit.metrics import registry as M
from rlhfkit.models import adapter_disabled, completion_token_stats
from rlhfkit.rewards import RewardOutput, RewardSources
from rlhfkit.sampling import Chunk, cat_padded, complete, decode, model_pad_id
from rlhfkit.trainers.evaluation import count_task_success
from rlhfkit.trainers.run import TrainingRun
from rlhfkit.trainers.sampler import Sampler
from rlhfkit.trainers.scoring import score_chunk, take_reward_logs


@dataclass
class ScoredRound:
    """One round of sampling and scoring on this process: its completions with their texts and rewards, not yet a
    batch. n completions of this process, P processes."""

    chunk: Chunk  # this process's prompts and completions, with the sampler's log-probs
    prompts: list  # (n,) the dataset's prompts (text, or lists of messages)
    completions: list[str]  # (n,) completion text
    rewards: torch.Tensor  # (K, n) float64 raw rewards per source, NaN where not applicable
    gathered: torch.Tensor  # (P x n,) float64 total rewards of every process, in process order (CPU)
    logged_columns: dict[str, list]  # the reward functions' log_extra, (n,) each
    tokens: int  # prompt + completion tokens, all processes
    # (K, P x n) float64 raw rewards per source of every process (CPU), NaN where not applicable; gathered only for
    # multi_objective_aggregation="normalize_then_sum", which normalises each source in its group
    gathered_rewards: torch.Tensor | None = None


@dataclass
class GRPOBatch:
    """One generation on this process, as the loss trains on it: N = local prompts x G completions, groups contiguous.
    T completion width. Part of a checkpoint while it has micro-batches to serve (GRPOTrainer.state_dict), so its
    field names are kept."""

    prompts: list  # (N,) the dataset's prompts (text, or lists of messages), each repeated G times
    completions: list[str]  # (N,) completion text (special tokens removed)
    input_ids: torch.Tensor  # (N, Lp + T) left-padded prompt then right-padded completion
    attention_mask: torch.Tensor  # (N, Lp + T) bool
    prompt_width: int  # Lp
    completion_ids: torch.Tensor  # (N, T)
    loss_mask: torch.Tensor  # (N, T) bool: completion tokens that count in the loss
    advantages: torch.Tensor  # (N,) float32
    rewards: torch.Tensor  # (K, N) float64 raw rewards per source, NaN where not applicable
    old_logprobs: torch.Tensor | None  # (N, T) logp_old, only when the generation outlives an optimizer step
    ref_logprobs: torch.Tensor | None  # (N, T), only when beta > 0
    num_items: float  # loss tokens of one optimizer step per process, on average: dapo/cispo/vespo's normaliser
    global_tokens: int  # prompt + completion tokens, all processes
    sampling_logprobs: torch.Tensor | None = None  # (N, T) the sampler's log-probs of the completion tokens
    logged_columns: dict[str, list] = field(default_factory=dict)  # the reward functions' log_extra, (N,) each
    rounds: int = 1  # generation rounds (prompt batches drawn) that made it: more than 1 only with dynamic_sampling
    staleness: int = 0  # optimizer steps between the weights that sampled it and those it trains (async_generation)


# One micro-batch of an optimizer step: (generation, index of the micro-batch in it, whether the generation was made
# on the current weights).
MicroBatch = tuple[GRPOBatch, int, bool]


class GRPOGeneration:
    """The generations of a GRPO run, from prompt indices to the batch the loss trains on, with its collaborators given
    explicitly: the run (accelerator, metrics, progress), the prepared policy `model` and frozen `ref_model` (None
    without one: beta 0, or LoRA's adapter-disabled policy), the reward sources, the sampler (its settings, episodes or
    a rollout_func, the generation worker), the tokenized train set and the task. It holds the current generation
    (`batch`), which a checkpoint keeps while it has micro-batches to serve."""

    def __init__(
        self,
        args: GRPOConfig,
        sizes: GRPOBatchSizes,
        run: TrainingRun,
        model: nn.Module,
        ref_model: nn.Module | None,
        rewards: RewardSources,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        train_dataset: Dataset,
        task=None,
    ):
        self.args, self.sizes, self.run = args, sizes, run
        self.model, self.ref_model = model, ref_model
        self.rewards, self.sampler = rewards, sampler
        self.tokenizer, self.train_dataset, self.task = tokenizer, train_dataset, task
        self.batch: GRPOBatch | None = None

    def micro_batches(self, step: int, prompts: Iterator[list[int]]) -> list[MicroBatch]:
        """The gradient_accumulation_steps micro-batches of optimizer step `step`, in order: a new generation (steps
        1-4) whenever the last one has served its steps_per_generation x num_iterations micro-batches, drawn from
        `prompts` (each a generation batch of prompt indices, all processes'); the progress counters move with it."""
        sizes, progress, accumulation = self.sizes, self.run.progress, self.args.gradient_accumulation_steps
        micro_batches, fresh = [], False  # fresh: the generation was made on these weights
        for micro in range((step - 1) * accumulation, step * accumulation):
            if micro % sizes.micro_steps_per_generation == 0:
                if self.sampler.worker is not None:
                    self.batch = self.receive(prompts)
                else:
                    self.batch = self.generate_and_score(next(prompts), prompts)
                fresh = self.batch.staleness == 0
                progress.generations += self.batch.rounds  # dynamic_sampling may draw further prompts
                progress.episode += sizes.completions * self.batch.rounds
                progress.num_tokens += self.batch.global_tokens
            micro_batches.append((self.batch, micro % sizes.steps_per_generation, fresh))
        return micro_batches

    # 1-2. Generate and score: rounds of completions -------------------------------------------------------------
    @torch.no_grad()  # not inference_mode: the batch's tensors feed the loss's autograd graph later
    def generate_and_score(
        self, prompt_indices: list[int], more_prompts: Iterator[list[int]] | None = None
    ) -> GRPOBatch:
        """Sample G completions per prompt of the generation batch `prompt_indices` (all processes' prompts), keep
        this process's slice, score them, and make the batch (steps 3-4).

        dynamic_sampling: after each round, the groups with reward spread are counted (on every process's rewards,
        so all processes agree) and further generation batches of prompts are drawn from `more_prompts` until each
        process holds its share of such groups, or max_num_gen_batches rounds were made (ops.select_groups); the
        batch is then made of the kept groups."""
        args = self.args
        with self.run.gathered(self.model) as model:  # whole weights while sampling (ZeRO-3, FSDP)
            rounds = [self.sample_round(model, prompt_indices)]
            if not args.dynamic_sampling:
                return self.batch_of(model, rounds[0], rounds[0].gathered, rounds)
            cap, processes = args.max_num_gen_batches or math.inf, self.run.accelerator.num_processes
            while True:
                rewards = [r.gathered for r in rounds]
                selection = ops.select_groups(rewards, args.num_generations, self.sizes.prompts, processes)
                if selection.enough or len(rounds) >= cap or more_prompts is None:
                    break
                rounds.append(self.sample_round(model, next(more_prompts)))
            m = self.run.metrics  # the same numbers on every process: their pooled mean is the number
            m.add(M.DYNAMIC_SAMPLING_EXTRA_ROUNDS, len(rounds) - 1, 1)
            m.add(M.DYNAMIC_SAMPLING_ZERO_STD_GROUPS_DROPPED, selection.zero_std_dropped, 1)
            m.add(M.DYNAMIC_SAMPLING_ZERO_STD_GROUPS_FILLED, selection.filled, 1)
            return self.merge_rounds(model, rounds, selection.kept)

    @torch.no_grad()
    def receive(self, prompts: Iterator[list[int]]) -> GRPOBatch:
        """async_generation: the worker's next generation (AsyncGeneration.next_generation: asked for up to max_staleness
        steps ahead, each on the weights of its time; with tools, episodes whose tools ran in the worker), scored and
        made into a batch as generate_and_score does with its own samples."""

        def ask():
            rows = self.round_rows(next(prompts))
            return rows, len(rows)  # one chunk, as sample_round samples

        generation = self.sampler.worker.next_generation(self.run, ask)
        (chunk,), staleness = generation.chunks, generation.staleness
        with self.run.gathered(self.model) as model:
            scored = self.score_round(generation.rows, chunk, generation.messages)
            batch = self.batch_of(model, scored, scored.gathered, [scored])
        batch.staleness = staleness
        return batch

    def sample_round(self, model: nn.Module, prompt_indices: list[int]) -> ScoredRound:
        """One round: this process's slice of the completions to `prompt_indices` (all processes' prompts), sampled by
        `model`, the unwrapped policy holding its whole weights; scored, gathered and logged."""
        rows = self.round_rows(prompt_indices)
        model.eval()
        config = self.sampler.config(self.args.max_completion_length)
        prompt_ids = [r["input_ids"] for r in rows]
        messages = None
        if (
            self.sampler.episodes is not None
        ):  # multi-turn with tools, or a rollout_func (and the rows as their episodes began)
            device, metrics = self.run.accelerator.device, self.run.metrics
            (episodes,), rows = sample_episodes(self.sampler.episodes, model, rows, config, len(rows), device, metrics)
            chunk, messages = episodes.chunk, episodes.messages
        else:
            (chunk,) = complete(model, prompt_ids, config, len(rows), self.run.accelerator.device)
        model.train()
        return self.score_round(rows, chunk, messages)

    def round_rows(self, prompt_indices: list[int]) -> list[dict]:
        """This process's dataset rows of a round: each prompt of `prompt_indices` (all processes') G times, sliced."""
        repeated = [i for i in prompt_indices for _ in range(self.args.num_generations)][self.own_slice()]
        fetched = {i: self.train_dataset[i] for i in dict.fromkeys(repeated)}  # each prompt's row read once
        return [fetched[i] for i in repeated]

    def own_slice(self) -> slice:
        """This process's completions of a round or batch, all processes' in process order (groups are contiguous;
        one may span processes)."""
        n = self.sizes.local_completions
        return slice(self.run.accelerator.process_index * n, (self.run.accelerator.process_index + 1) * n)

    def score_round(self, rows: list[dict], chunk: Chunk, messages: list[list[dict]] | None = None) -> ScoredRound:
        """The round of the completions `chunk` (one chunk, all of this process's rows): scored, gathered and logged
        (completions/*, rewards/*, frac_reward_zero_std describe every round's completions). messages: multi-turn
        episodes' messages after the prompt, which the reward functions get as the completions (TRL's form)."""
        args, acc = self.args, self.run.accelerator
        G, device = args.num_generations, acc.device
        prompts = [r[args.dataset_text_field] for r in rows]
        # An episode with tools as the policy read it, special tokens kept: its turns, calls and the tools' results
        # (the completions table); the reward functions get its messages.
        texts = decode(
            self.tokenizer, chunk.completion_ids, chunk.completion_mask, skip_special_tokens=messages is None
        )

        # Rewards: each source's raw values, then the weighted total per completion.
        scored = texts if messages is None else messages
        outputs = score_chunk(self.rewards, rows, prompts, scored, chunk, self.run.callbacks.state)
        total = self.rewards.total(outputs, prompts)
        logged_columns, logged_metrics = take_reward_logs(self.rewards, acc)  # log_extra, log_metric (collective)
        self.run.reward_metrics.add(logged_metrics)

        # Every process's rewards, in process order: a group spanning processes is one group.
        gathered = acc.gather(total.to(device)).double().cpu()
        rewards = torch.stack([o.values for o in outputs])  # (K, n)
        gathered_rewards = None
        if args.multi_objective_aggregation == "normalize_then_sum":  # each source is normalised in its group
            gathered_rewards = acc.gather(rewards.t().contiguous().to(device)).t().double().cpu()
        zero_std = ops.zero_std_groups(gathered, G).repeat_interleave(G)[self.own_slice()]
        counts = torch.tensor([chunk.prompt_mask.sum(), chunk.model_mask.sum()], dtype=torch.float64, device=device)
        prompt_tokens, completion_tokens = acc.reduce(counts, "sum").tolist()
        self.log_round(outputs, total, zero_std, chunk, prompts, texts)
        return ScoredRound(
            chunk=chunk,
            prompts=prompts,
            completions=texts,
            rewards=rewards,
            gathered=gathered,
            logged_columns=logged_columns,
            tokens=int(prompt_tokens + completion_tokens),
            gathered_rewards=gathered_rewards,
        )

    def log_round(self, outputs: list[RewardOutput], total, zero_std, chunk: Chunk, prompts, texts) -> None:
        """Completion lengths, rewards and true success of one round, pooled when reduced. zero_std: (n,) whether each
        completion's group (which may span processes) had identical rewards."""
        m = self.run.metrics
        lengths = chunk.model_mask.sum(1).double()  # the policy's tokens: tool results left out, as TRL
        m.add_tensor(M.COMPLETIONS_MEAN_LENGTH, lengths)
        m.add_tensor(M.COMPLETIONS_MIN_LENGTH, lengths)
        m.add_tensor(M.COMPLETIONS_MAX_LENGTH, lengths)
        m.add_tensor(M.COMPLETIONS_CLIPPED_RATIO, (~chunk.terminated).double())
        for metric in (
            M.COMPLETIONS_MEAN_TERMINATED_LENGTH,
            M.COMPLETIONS_MIN_TERMINATED_LENGTH,
            M.COMPLETIONS_MAX_TERMINATED_LENGTH,
        ):
            m.add_tensor(metric, lengths, chunk.terminated)
        self.rewards.log(m, outputs)
        m.add_tensor(M.REWARD, total)
        m.add_tensor(M.REWARD_STD, total)
        m.add_tensor(M.FRAC_REWARD_ZERO_STD, zero_std.double())
        count_task_success(m, M.ROLLOUT_TASK_SUCCESS, self.task, prompts, texts)

    def merge_rounds(self, model: nn.Module, rounds: list[ScoredRound], kept: list[int]) -> GRPOBatch:
        """The batch of the groups `kept` (ops.select_groups: indices into the rounds' groups, process by process):
        this process's share are groups it generated, whose rows are padded again to a common width (prompts on the
        left, completions on the right) when they come from several rounds."""
        G, P, acc = self.args.num_generations, self.run.accelerator.num_processes, self.run.accelerator
        per_round = self.sizes.prompts  # groups of a round, all processes
        local_groups = per_round // P
        mine = kept[acc.process_index * local_groups : (acc.process_index + 1) * local_groups]
        gathered = torch.cat([r.gathered for r in rounds]).view(-1, G)[kept].reshape(-1)  # the batch's, all processes
        gathered_rewards = None
        if rounds[0].gathered_rewards is not None:  # (K, groups x G) of every round, then the kept groups
            every = torch.cat([r.gathered_rewards for r in rounds], dim=1)
            gathered_rewards = every.view(every.shape[0], -1, G)[:, kept].reshape(every.shape[0], -1)
        if len(rounds) == 1:  # one round holds exactly the batch's groups: all of them are kept, in order
            return self.batch_of(model, rounds[0], gathered, rounds)
        parts: list[tuple[ScoredRound, torch.Tensor]] = []  # (round, this process's rows of it), in order
        for r, source in enumerate(rounds):
            groups = [g % per_round - acc.process_index * local_groups for g in mine if g // per_round == r]
            if groups:
                rows = [g * G + i for g in groups for i in range(G)]
                parts.append((source, torch.tensor(rows, device=source.chunk.prompt_ids.device)))
        pad = model_pad_id(model, self.tokenizer.pad_token_id)
        chunks = [(source.chunk, rows) for source, rows in parts]
        sampling_logprobs = None
        if all(c.sampling_logprobs is not None for c, _ in chunks):
            sampling_logprobs = cat_padded([c.sampling_logprobs[rows] for c, rows in chunks], 0.0)
        chunk = Chunk(
            prompt_ids=cat_padded([c.prompt_ids[rows] for c, rows in chunks], pad, left=True),
            prompt_mask=cat_padded([c.prompt_mask[rows] for c, rows in chunks], False, left=True),
            completion_ids=cat_padded([c.completion_ids[rows] for c, rows in chunks], pad),
            completion_mask=cat_padded([c.completion_mask[rows] for c, rows in chunks], False),
            terminated=torch.cat([c.terminated[rows] for c, rows in chunks]),
            sampling_logprobs=sampling_logprobs,
            tool_mask=None
            if chunks[0][0].tool_mask is None
            else cat_padded([c.tool_mask[rows] for c, rows in chunks], True),
        )
        merged = ScoredRound(
            chunk=chunk,
            prompts=[source.prompts[i] for source, rows in parts for i in rows.tolist()],
            completions=[source.completions[i] for source, rows in parts for i in rows.tolist()],
            rewards=torch.cat([source.rewards[:, rows.to(source.rewards.device)] for source, rows in parts], dim=1),
            gathered=gathered,
            logged_columns={
                key: [v for source, rows in parts for v in (source.logged_columns[key][i] for i in rows.tolist())]
                for key in rounds[0].logged_columns
            },
            tokens=0,
            gathered_rewards=gathered_rewards,
        )
        return self.batch_of(model, merged, gathered, rounds)

    # 3-4. Advantages, loss mask, old and reference log-probs ----------------------------------------------------
    def batch_of(
        self, model: nn.Module, scored: ScoredRound, gathered: torch.Tensor, rounds: list[ScoredRound]
    ) -> GRPOBatch:
        """The GRPOBatch of this process's scored completions `scored`: advantages over the whole batch (all
        processes' total rewards `gathered`, so scale_rewards="batch" uses the batch std; with normalize_then_sum the
        sources' rewards of every process, scored.gathered_rewards; each process's completions a contiguous block in
        gathered order), the loss mask and the no-gradient log-probs, over prompts and completions padded to
        pad_to_multiple_of. rounds: every round generated for it (episode and token counts)."""
        args, acc, chunk = self.args, self.run.accelerator, scored.chunk
        if args.pad_to_multiple_of is not None:  # TRL's padding of prompts and completions: fewer distinct shapes
            chunk = chunk.padded_to_multiple(args.pad_to_multiple_of, model_pad_id(model, self.tokenizer.pad_token_id))
        ids, mask, width = chunk.input_ids, chunk.attention_mask, chunk.prompt_ids.shape[1]
        advantages = self.advantages(gathered, scored.gathered_rewards, args.num_generations)[self.own_slice()]
        loss_mask = self.loss_mask(chunk)
        loss_tokens = acc.reduce(loss_mask.sum().to(torch.float64).reshape(1), "sum").item()

        old_logprobs = None
        if args.gradient_accumulation_steps % self.sizes.micro_steps_per_generation:  # outlives an optimizer step
            # logp_old: the sampler's log-probs where exact, else a full forward's (a rollout_func's never stand in)
            exact = not isinstance(self.sampler.episodes, CustomRollout) and self.run.sampling_logprobs_exact(model)
            old_logprobs = (
                chunk.sampling_logprobs if exact else self.logprobs(model, ids, mask, width, chunk.completion_ids)
            )
        return GRPOBatch(
            prompts=scored.prompts,
            completions=scored.completions,
            input_ids=ids,
            attention_mask=mask,
            prompt_width=width,
            completion_ids=chunk.completion_ids,
            loss_mask=loss_mask,
            advantages=advantages.float().to(acc.device),
            rewards=scored.rewards,
            old_logprobs=old_logprobs,
            ref_logprobs=self.reference_logprobs(model, ids, mask, width, chunk.completion_ids),
            num_items=self.step_tokens(loss_tokens),
            global_tokens=sum(r.tokens for r in rounds),
            sampling_logprobs=chunk.sampling_logprobs,
            logged_columns=scored.logged_columns,
            rounds=len(rounds),
        )

    def advantages(self, totals: torch.Tensor, per_source: torch.Tensor | None, group: int) -> torch.Tensor:
        """(N,) advantages of completions in consecutive groups of `group`: with normalize_then_sum (GDPO) each
        source's rewards `per_source` (K, N) normalised in its group, then weighed; else the weighted totals (N,)
        normalised as scale_rewards says."""
        args = self.args
        if args.multi_objective_aggregation == "normalize_then_sum":
            weights = torch.tensor(self.rewards.weights, dtype=torch.float64)
            return ops.decoupled_group_advantages(per_source, weights, group)
        return ops.group_advantages(totals, group, args.scale_rewards)

    def loss_mask(self, chunk: Chunk) -> torch.Tensor:
        """(N, T) the completion tokens the loss trains on: the model's own (with tools, their results are read but
        not trained on: TRL's tool_mask), and none of a truncated completion's with mask_truncated_completions."""
        if self.args.mask_truncated_completions:
            return chunk.model_mask & chunk.terminated[:, None]
        return chunk.model_mask

    def step_tokens(self, generation_tokens: float) -> float:
        """TRL's normaliser of dapo, cispo and vespo: a generation's loss tokens (all processes) per process, spread
        over the optimizer steps it spans (steps_per_generation / gradient_accumulation_steps of them)."""
        processes, accumulation = self.run.accelerator.num_processes, self.args.gradient_accumulation_steps
        return generation_tokens / processes * accumulation / self.sizes.steps_per_generation

    def logprobs(self, model: nn.Module, ids, mask, width: int, completion_ids) -> torch.Tensor:
        """Log-probs (N, T) of the completion tokens `completion_ids` (N, T) under `model`, from ids and mask
        (N, Lp + T) with prompt width Lp, in micro-batches of per_device_train_batch_size."""
        args = self.args
        step = args.per_device_train_batch_size
        parts = []
        for i in range(0, len(ids), step):
            rows = slice(i, i + step)
            part = completion_token_stats(
                model, ids[rows], mask[rows], width, completion_ids[rows], args.temperature,
                padding_free=args.padding_free,
            )  # fmt: skip
            parts.append(part.logprobs)
        return torch.cat(parts)

    def reference_logprobs(self, model: nn.Module, ids, mask, width: int, completion_ids) -> torch.Tensor | None:
        """(N, T) log-probs of the reference (beta > 0; else None): the frozen copy's, or with LoRA the policy's with
        its adapter disabled."""
        if self.args.beta == 0.0:
            return None
        if self.ref_model is not None:
            return self.logprobs(self.ref_model, ids, mask, width, completion_ids)
        with adapter_disabled(model) as base:
            return self.logprobs(base, ids, mask, width, completion_ids)
