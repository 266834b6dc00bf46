"""Scores from reward models and reward functions: the reward sources both trainers score completions with."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
import traceback
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit import ops
from rlhfkit.data import as_completions, is_conversational
from rlhfkit.errors import ConfigError, RewardFunctionError, UnscoredCompletionWarning
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import DEFAULT_HUB, Hub, load_reward_model, token_values
from rlhfkit.sampling import embeddable_ids
from rlhfkit.trl_rewards import TRL_REWARDS, trl_reward_function


@torch.inference_mode()
def reward_model_scores(
    reward_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Reward-model score (B,) read at the last real token of each sequence.

    input_ids, attention_mask: (B, L); attention_mask bool, True = real token. With a left-padded query and a
    right-padded completion, the last real token is the completion's terminator (or its last token if truncated).
    """
    input_ids = embeddable_ids(reward_model, input_ids, attention_mask)  # a [PAD] beyond its embeddings (TRL's ppo.py)
    values = token_values(reward_model, input_ids, attention_mask)
    last = ops.last_true_index(attention_mask)
    return values.gather(1, last.clamp(min=0)[:, None]).squeeze(1)


def apply_eos_trick(
    scores: torch.Tensor,
    terminated: torch.Tensor,
    missing_eos_penalty: float | None,
    non_eos_penalty: bool,
    penalty_reward_value: float,
) -> torch.Tensor:
    """Penalise completions that never produced the stop token.

    non_eos_penalty replaces their score by penalty_reward_value (the N+ implementation details / CleanRL);
    missing_eos_penalty subtracts a constant (TRL's current option). Both may be combined: replace, then subtract.
    """
    scores = scores.clone()
    if non_eos_penalty:
        scores[~terminated] = penalty_reward_value
    if missing_eos_penalty is not None:
        scores[~terminated] -= missing_eos_penalty
    return scores


# ------------------------------------------------------------------------------------------------
# Reward sources: reward functions (TRL's calling convention) and reward models behind one interface
# ------------------------------------------------------------------------------------------------


class RewardOutput(NamedTuple):
    """One reward source's values for a batch of N completions."""

    values: torch.Tensor  # (N,) float64; NaN where not applicable (the function returned None or NaN)
    applicable: torch.Tensor  # (N,) bool, True where the function returned a finite number


def _as_number(value: Any) -> float | None:
    """A plain float for a real number (bools, NumPy and 0-d tensors included), None for None; else raise TypeError."""
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return _as_number(value.item())
    raise TypeError


def _invoke(name: str, fn: Callable, kwargs: dict[str, Any]) -> Any:
    """fn(**kwargs), an exception turned into a RewardFunctionError naming the function. kwargs is a dict so that
    dataset columns may have any name ("name" and "fn" included)."""
    try:
        return fn(**kwargs)
    except Exception as e:
        raise RewardFunctionError(f"reward function {name!r} raised {type(e).__name__}: {e}") from e


def run_awaitables(named: list[tuple[str, Awaitable]]) -> list[Any]:
    """The results of the reward functions' awaitables (name, awaitable), in order, awaited concurrently
    (asyncio.gather) in a fresh event loop; in a worker thread when this thread already runs an event loop (a
    notebook, an async caller), which cannot be re-entered. Nothing outlives the call: objects bound to an event
    loop (async HTTP clients) must be created inside the function, not kept between calls.

    Every awaitable runs to its end; then the first one to fail, in order, raises a RewardFunctionError naming it."""

    async def one(name: str, awaitable: Awaitable) -> Any:
        try:
            return await awaitable
        except Exception as e:
            raise RewardFunctionError(f"reward function {name!r} raised {type(e).__name__}: {e}") from e

    async def gather() -> list[Any]:
        return await asyncio.gather(*(one(name, aw) for name, aw in named), return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running in this thread: the usual case (the training loop)
        results = asyncio.run(gather())
    else:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlhfkit-rewards") as pool:
            results = pool.submit(asyncio.run, gather()).result()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _close(awaitables: list[Awaitable]) -> None:
    """Close coroutines that will never be awaited (an earlier function failed), so Python does not warn of them."""
    for awaitable in awaitables:
        if inspect.iscoroutine(awaitable):
            awaitable.close()


def check_reward_values(name: str, out: Any, n: int) -> RewardOutput:
    """The RewardOutput of what reward function `name` returned for n completions: one real number per completion
    (bools, NumPy and 0-d tensors included), None where it does not apply; anything else is a RewardFunctionError
    naming the function, because a silently misaligned reward trains the wrong behaviour. NaN means "does not apply"
    too, as in TRL (its GRPO combines rewards with nansum and nanmean); +-inf is an error naming the completion, since
    one infinite reward turns its whole group's advantages into NaN."""
    if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence) and not hasattr(out, "tolist"):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(out).__name__}; it must return a list with one float "
            f"(or None) per completion ({n} here)."
        )
    out = out.tolist() if hasattr(out, "tolist") else list(out)
    if len(out) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(out)} values for {n} completions; it must return one per "
            "completion, in order."
        )
    values = []
    for i, value in enumerate(out):
        try:
            number = _as_number(value)
        except TypeError:
            raise RewardFunctionError(
                f"reward function {name!r} returned {value!r} ({type(value).__name__}) for completion {i}; "
                "rewards must be numbers, or None where the function does not apply."
            ) from None
        if number is not None and math.isinf(number):
            raise RewardFunctionError(
                f"reward function {name!r} returned {number} for completion {i}; rewards must be finite (None or "
                "NaN where the function does not apply)."
            )
        values.append(None if number is None or math.isnan(number) else number)
    applicable = torch.tensor([v is not None for v in values], dtype=torch.bool)
    tensor = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
    return RewardOutput(tensor, applicable)


def weighted_total(outputs: list[RewardOutput], weights: list[float], prompts: list[str]) -> torch.Tensor:
    """R_i = sum over the sources that apply to completion i of w_k * r_ik. (N,) float64.

    A completion that no source scores gets 0, with a warning naming the first one, as TRL 1.16 does (it sums the
    rewards with NaN left out): training goes on, and the warning says which prompt no function scored.
    """
    values = torch.stack([o.values for o in outputs])  # (K, N)
    applicable = torch.stack([o.applicable for o in outputs])
    w = torch.tensor(weights, dtype=torch.float64)[:, None]
    unscored = ~applicable.any(0)
    if unscored.any():
        i = int(unscored.nonzero()[0])
        warnings.warn(
            f"every reward function returned None or NaN for {int(unscored.sum())} of {len(prompts)} completions, "
            f"e.g. completion {i} (prompt {prompts[i]!r}): they get reward 0, as in TRL. Make at least one reward "
            "function score each completion.",
            UnscoredCompletionWarning,
            stacklevel=2,
        )
    return torch.where(applicable, w * values, 0.0).sum(0)


class RewardModelFunction:
    """A sequence-classification reward model used as a reward function (score at the last real token).

    When the reward model's tokenizer is the policy's (same vocabulary), the policy's own token ids are scored,
    EOS included, exactly as the reward model saw sequences in training. Otherwise prompt + completion text is
    re-tokenised with the reward model's tokenizer (TRL's behaviour), so any reward model works with any policy.
    Conversations (prompt messages plus the assistant's completion) are rendered with the reward model's own chat
    template, as TRL does: the template the reward model was trained with. policy_tokens: the model reads the
    policy's tokenizer (PPO's reward_model_path, TRL's PPO): it scores the policy's ids always, conversations too.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        name: str,
        same_vocab: bool,
        batch_size: int = 64,
        policy_tokens: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.__name__ = name
        self.same_vocab = same_vocab
        self.batch_size = batch_size
        self.policy_tokens = policy_tokens  # always score the policy's ids, conversations too (PPO's reward model)

    @torch.inference_mode()
    def __call__(self, prompts: list, completions: list, sequence_ids=None, **kwargs) -> list[float]:
        device = next(self.model.parameters()).device
        own_tokens = self.policy_tokens or self.same_vocab and not is_conversational(prompts[0])
        if own_tokens and sequence_ids is not None:
            ids, mask = sequence_ids
        else:
            enc = self.tokenizer(
                self._texts(prompts, completions), padding=True, return_tensors="pt", add_special_tokens=False
            )
            ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        scores = [
            reward_model_scores(
                self.model, ids[i : i + self.batch_size].to(device), mask[i : i + self.batch_size].to(device)
            )
            for i in range(0, len(ids), self.batch_size)
        ]
        return torch.cat(scores).double().cpu().tolist()

    def _texts(self, prompts: list, completions: list) -> list[str]:
        if not is_conversational(prompts[0]):
            return [p + c for p, c in zip(prompts, completions, strict=True)]
        if not getattr(self.tokenizer, "chat_template", None):
            raise RewardFunctionError(
                f"reward model {self.__name__!r} scores conversations, but its tokenizer has no chat template to "
                "render them: use a reward model with one (set tokenizer.chat_template), or text prompts."
            )
        return [self.tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]


def reward_name(source: Callable | nn.Module) -> str:
    """The name a reward source's metrics and table column carry: a function's __name__, a model's directory name."""
    if isinstance(source, nn.Module):
        path = getattr(getattr(source, "config", None), "_name_or_path", "") or type(source).__name__
        return os.path.basename(os.path.normpath(path))
    return getattr(source, "__name__", type(source).__name__)


def reward_sources(
    sources: Callable | str | nn.Module | Sequence[Callable | str | nn.Module],
    processing_classes: Sequence[PreTrainedTokenizerBase | None] | None,
    policy_tokenizer: PreTrainedTokenizerBase,
    dtype: torch.dtype,
    device: torch.device,
    hub: Hub = DEFAULT_HUB,
) -> tuple[list[str], list[Callable]]:
    """Names and callables of GRPO's reward sources (TRL's ``reward_funcs``): callables stay as they are; reward
    models, given as paths or modules, are loaded with their own tokenizer and wrapped as RewardModelFunction.

    processing_classes: the reward models' tokenizers, aligned with `sources` (None: load from the model's path); one
    tokenizer alone stands for a list of one, as in TRL."""
    sources = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    if not sources:
        raise ConfigError("reward_funcs is empty: give at least one reward function or reward model.")
    if isinstance(processing_classes, PreTrainedTokenizerBase):
        processing_classes = [processing_classes]
    processing_classes = list(processing_classes or [None] * len(sources))
    if len(processing_classes) != len(sources):
        raise ConfigError(
            f"reward_processing_classes has {len(processing_classes)} entries for {len(sources)} reward_funcs: the "
            "counts must match, one per reward function (None for functions), in the same order."
        )
    names, funcs = [], []
    for source, tokenizer in zip(sources, processing_classes):
        if isinstance(source, (str, nn.Module)):
            model, tokenizer = load_reward_model(source, tokenizer, dtype, hub)
            same_vocab = tokenizer.get_vocab() == policy_tokenizer.get_vocab()
            model = model.eval().requires_grad_(False).to(device)
            source = RewardModelFunction(model, tokenizer, reward_name(model), same_vocab)
        elif not callable(source):
            raise ConfigError(f"reward_funcs entry {source!r} is neither callable, a model, nor a model path.")
        names.append(reward_name(source))
        funcs.append(source)
    return names, funcs  # RewardSources checks that the names are unique


def check_unique_names(names: list[str]) -> None:
    """Each reward source names its metrics (rewards/<name>/mean): two sources with one name would share them."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"two reward functions share the name {duplicates[0]!r}; metric names rewards/<name>/mean must be "
            "unique: rename one (set its __name__)."
        )


def reward_weights(weights: Sequence[float] | None, names: list[str]) -> list[float]:
    """One float weight per reward source (default all 1), in the order of `names`."""
    weights = list(weights) if weights is not None else [1.0] * len(names)
    if len(weights) != len(names):
        raise ConfigError(
            f"reward_weights has {len(weights)} values for {len(names)} reward functions ({', '.join(names)}): give "
            "one weight per reward function, in that order."
        )
    return [float(w) for w in weights]


def score_completions(
    names: list[str],
    funcs: list[Callable],
    rows: list[dict],
    prompts: list,
    completions: list[str],
    sequence: tuple[torch.Tensor, torch.Tensor],
    completion: tuple[torch.Tensor, torch.Tensor],
    text_field: str,
    trainer_kwargs: Sequence[Mapping[str, Any]] | None = None,
) -> list[RewardOutput]:
    """Every reward source's RewardOutput for N completions, in the order of `funcs`.

    trainer_kwargs: aligned with `funcs`, what else each function gets (TRL 1.16's trainer_state, log_extra and
    log_metric: RewardSources.score passes those a function takes).

    rows: the dataset rows, one per completion; their other columns reach the functions as keyword arguments (TRL's
    convention), with completion_ids. As in TRL, functions get the dataset's prompts as they are (text, or lists of
    messages) and the completions in the same format (text, or [{"role": "assistant", "content": text}]).
    sequence: (ids, mask) (N, L) of prompt + completion in the policy's tokens, which a reward model with the
    policy's vocabulary scores directly; completion: (ids, mask) (N, T) of the completions alone.

    Functions may be ``async def`` (or return an awaitable), as in TRL: the sync ones are called in order, then all
    the async ones of this call are awaited together (run_awaitables); their results are checked like the others'."""
    skip = {text_field, "input_ids"}
    columns = {key: [row[key] for row in rows] for key in rows[0] if key not in skip} if rows else {}
    completion_ids = [ids[mask].tolist() for ids, mask in zip(*completion)]
    completions = as_completions(completions, prompts)
    n = len(completions)
    outputs: list[RewardOutput | None] = []
    pending: dict[int, Awaitable] = {}  # the async functions' awaitables, by position
    trainer_kwargs = trainer_kwargs or [{}] * len(funcs)
    try:
        for i, (name, fn) in enumerate(zip(names, funcs)):
            extra = {"sequence_ids": sequence} if isinstance(fn, RewardModelFunction) else dict(trainer_kwargs[i])
            kwargs = {**columns, "prompts": prompts, "completions": completions, "completion_ids": completion_ids}
            out = _invoke(name, fn, {**kwargs, **extra})
            if inspect.isawaitable(out):
                pending[i] = out
                outputs.append(None)
            else:
                outputs.append(check_reward_values(name, out, n))
    except BaseException:
        _close(list(pending.values()))
        raise
    if pending:
        results = run_awaitables([(names[i], aw) for i, aw in pending.items()])
        for i, out in zip(pending, results):
            outputs[i] = check_reward_values(names[i], out, n)
    return outputs


TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric")


def takes_trainer_kwargs(fn: Callable) -> frozenset[str]:
    """Which of TRAINER_KWARGS reward function `fn` receives: all of them when it takes **kwargs (TRL's convention,
    TRL passes them to every function), else those its signature names; a function without them keeps working."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): give nothing it might not take
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset(TRAINER_KWARGS)
    names = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return frozenset(k for k in TRAINER_KWARGS if k in names)


class RewardSources:
    """The reward functions and reward models a trainer scores completions with, their weights and metrics.

    names, funcs: aligned, in the order of reward_weights (GRPOTrainer: its reward_funcs as given; the command line
    puts reward models first, as `trl grpo`; PPOTrainer: its reward_funcs, then reward_model). text_field: the dataset
    column of the prompts (the other columns reach the functions as keyword arguments).

    As TRL 1.16, a function also gets ``trainer_state`` (the trainer's transformers TrainerState, as given to
    :meth:`score`), ``log_extra(column, values)`` (one value per completion of the call, shown as a column of the
    completions table) and ``log_metric(name, value)`` (a scalar, averaged per logging window as TRL does): those
    its signature takes (takes_trainer_kwargs). What they log is held here until the trainer takes it
    (:meth:`take_logged`)."""

    def __init__(self, names: list[str], funcs: list[Callable], weights: Sequence[float] | None, text_field: str):
        check_unique_names(names)
        self.names, self.funcs, self.text_field = names, funcs, text_field
        self.weights = reward_weights(weights, names)
        self.metrics = [(M.expand(M.REWARDS_FUNC_MEAN, n), M.expand(M.REWARDS_FUNC_STD, n)) for n in names]
        self.takes = [frozenset() if isinstance(f, RewardModelFunction) else takes_trainer_kwargs(f) for f in funcs]
        self.takes_log_metric = any("log_metric" in t for t in self.takes)  # the same on every process
        self._extra: dict[str, list] = {}  # log_extra columns, one value per completion scored since take_logged
        self._logged: dict[str, list[float]] = {}  # log_metric values since take_logged
        self._rows = 0  # completions scored since take_logged

    def score(self, rows: list[dict], prompts: list, completions: list[str], sequence, completion, trainer_state=None):
        """Each source's RewardOutput (score_completions). trainer_state: the trainer's TrainerState, passed to the
        functions that take it (TRL 1.16's `trainer_state`)."""
        n = len(completions)
        call_extra: dict[str, tuple[list, list[str]]] = {}  # column -> (values, the functions that logged them)
        call_metrics: dict[str, list[float]] = {}
        trainer_kwargs = []
        for name, takes in zip(self.names, self.takes):
            given = {
                "trainer_state": trainer_state,
                "log_extra": functools.partial(self._log_extra, call_extra, name),
                "log_metric": functools.partial(self._log_metric, call_metrics, name),
            }
            trainer_kwargs.append({k: v for k, v in given.items() if k in takes})
        outputs = score_completions(
            self.names, self.funcs, rows, prompts, completions, sequence, completion, self.text_field, trainer_kwargs
        )
        for column, (values, by) in call_extra.items():
            if len(values) != n:
                raise RewardFunctionError(
                    f"reward function {' and '.join(dict.fromkeys(by))!r} logged {len(values)} values of column "
                    f"{column!r} (log_extra) for {n} completions: give one value per completion, in order, once per "
                    "call."
                )
        for column in self._extra.keys() - call_extra.keys():  # columns of earlier calls: None for these rows
            self._extra[column] += [None] * n
        for column, (values, _) in call_extra.items():
            self._extra.setdefault(column, [None] * self._rows).extend(values)
        for metric, values in call_metrics.items():
            self._logged.setdefault(metric, []).extend(values)
        self._rows += n
        return outputs

    def _log_extra(self, call_extra: dict, function: str, column: str, values) -> None:
        """log_extra(column, values) as reward function `function` calls it."""
        if not isinstance(column, str) or not column:
            raise RewardFunctionError(f"log_extra: the column name must be a non-empty str, not {column!r}.")
        if (
            isinstance(values, (str, bytes, Mapping))
            or not isinstance(values, Sequence)
            and not hasattr(values, "tolist")
        ):
            raise RewardFunctionError(
                f"log_extra({column!r}, ...): values must be a list with one value per completion, not "
                f"{type(values).__name__}."
            )
        values = values.tolist() if hasattr(values, "tolist") else list(values)
        logged, by = call_extra.setdefault(column, ([], []))
        logged.extend(values)
        by.append(function)

    def _log_metric(self, call_metrics: dict, function: str, name: str, value) -> None:
        """log_metric(name, value) as reward function `function` calls it."""
        own = {m.name for pair in self.metrics for m in pair}
        if not isinstance(name, str) or not name:
            raise RewardFunctionError(f"log_metric: the metric name must be a non-empty str, not {name!r}.")
        if name in own or {name, f"eval/{name}"} & M.REGISTRY.keys():  # an evaluation logs it as eval/<name>
            raise RewardFunctionError(
                f"log_metric({name!r}, ...): {name!r} is a metric rlhfkit logs itself (or eval/{name} is); a reward "
                "function's metric would replace it in the logged row. Give it a name of its own (e.g. "
                "'rewards_extra/...')."
            )
        try:
            number = _as_number(value)
        except TypeError:
            number = None
        if number is None:
            raise RewardFunctionError(
                f"log_metric({name!r}, {value!r}): the value must be a real number ({type(value).__name__} given)."
            )
        call_metrics.setdefault(name, []).append(number)

    def take_logged(self) -> tuple[dict[str, list], dict[str, list[float]]]:
        """What the reward functions logged since the last call, and forget it: (extra columns, each with one value
        per completion scored since, in scoring order, None where a call did not log that column; log_metric's
        values by name, in call order)."""
        logged = (self._extra, self._logged)
        self._extra, self._logged, self._rows = {}, {}, 0
        return logged

    def pool_metrics(self, metrics: Mapping[str, Sequence[float]], accelerator) -> dict[str, float]:
        """One value per name of one generation's log_metric values (take_logged's second part), as TRL 1.16:
        their sum and count over every process, total / count (NaN if one was NaN). The names are those any process
        logged, sorted, so every process reduces the same ones in the same order. A collective: every process calls
        it once per generation; none is needed (and {} is returned) when no function takes log_metric."""
        if not self.takes_log_metric:
            return {}
        names = sorted(metrics)
        if accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            names = sorted(set(gather_object(names)))
        if not names:
            return {}
        local = [[float(sum(metrics.get(n, ()))), float(len(metrics.get(n, ())))] for n in names]
        pooled = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=accelerator.device), "sum")
        return {n: total / count for n, (total, count) in zip(names, pooled.tolist()) if count > 0}

    def total(self, outputs: list[RewardOutput], prompts: list) -> torch.Tensor:
        """(N,) float64 weighted sum of the sources that apply to each completion (weighted_total)."""
        return weighted_total(outputs, self.weights, prompts)

    @property
    def sources(self) -> list:
        """The reward models (modules) and functions, in order: TRL's trainer.reward_funcs."""
        return [f.model if isinstance(f, RewardModelFunction) else f for f in self.funcs]

    @property
    def processing_classes(self) -> list:
        """Each reward model's tokenizer, None for a function: TRL's trainer.reward_processing_classes."""
        return [f.tokenizer if isinstance(f, RewardModelFunction) else None for f in self.funcs]

    def prepare_models(self, prepare: Callable[[nn.Module], nn.Module]) -> None:
        """Pass each reward model's module through `prepare` (e.g. TrainingRun.prepare_frozen: sharded for ZeRO-3 or
        FSDP like the policy)."""
        for func in self.funcs:
            if isinstance(func, RewardModelFunction):
                func.model = prepare(func.model)

    def log(self, metrics: MetricAccumulator, outputs: list[RewardOutput]) -> None:
        """rewards/<name>/mean and /std of each source's raw values, over the completions it scored."""
        for (mean, std), out in zip(self.metrics, outputs):
            metrics.add_tensor(mean, out.values, out.applicable)
            metrics.add_tensor(std, out.values, out.applicable)


class LoggedMetricsWindow:
    """The reward functions' log_metric values of one logging window, averaged as TRL 1.16 averages its metrics:
    one value per generation (RewardSources.pool_metrics), then the mean of the window's generations, NaN left out;
    a name with no finite value in the window is left out of the row (TRL logs None)."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}

    def add(self, generation: Mapping[str, float]) -> None:
        for name, value in generation.items():
            self._values.setdefault(name, []).append(float(value))

    def reduce(self) -> dict[str, float]:
        """The window's means by name (sorted), and a fresh window."""
        means = {}
        for name in sorted(self._values):
            valid = [v for v in self._values[name] if not math.isnan(v)]
            if valid:
                means[name] = sum(valid) / len(valid)
        self._values = {}
        return means


# ------------------------------------------------------------------------------------------------
# --reward_funcs: names to reward functions
# ------------------------------------------------------------------------------------------------

REFERENCE_FORMS = "'module:function', 'path/to/file.py:function' or TRL's dotted 'module.function'"


def import_reward_function(ref: str) -> Callable:
    """The function named by a reference: "module:function", "path/to/file.py:function", or TRL's dotted
    "module.function" (split at the last dot, as TRL's GRPO script does). The module is imported only because the user
    named it; the current directory is importable, as with ``python -m``."""
    if ":" in ref:
        module_name, _, attr = ref.rpartition(":")
        form = "a 'module:function' or 'path/to/file.py:function' reference"
    else:
        module_name, _, attr = ref.rpartition(".")
        form = "TRL's dotted 'module.function' reference"
    accepted = f"--reward_funcs takes a built-in reward name, {REFERENCE_FORMS}."
    if ":" not in ref and ref.endswith(".py"):
        raise ConfigError(f"--reward_funcs {ref!r}: name the function in the file too, as '{ref}:function'.")
    if not module_name or not attr:
        raise ConfigError(f"--reward_funcs {ref!r}: expected a module and a function name. {accepted}")
    tried = f"read as {form}: module {module_name!r}, function {attr!r}"
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ConfigError(
                    f"--reward_funcs {ref!r}: the file {module_name!r} does not exist (relative to {os.getcwd()})."
                )
            spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"--reward_funcs {ref!r}: cannot import {module_name!r} ({e}); {tried}, looked up from the current "
            f"directory and the installed packages. {accepted}"
        ) from e
    except SyntaxError as e:
        raise ConfigError(
            f"--reward_funcs {ref!r}: {e.filename}, line {e.lineno}: {type(e).__name__}: {e.msg}. Fix the file."
        ) from None
    except ConfigError:
        raise
    except Exception as e:  # the module raised while it was imported
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(
            f"--reward_funcs {ref!r}: importing {module_name!r} raised {type(e).__name__}: {e} ({frame.filename}, "
            f"line {frame.lineno}). Fix the module: it runs when rlhfkit imports it."
        ) from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--reward_funcs {ref!r}: {module_name!r} has no function {attr!r} ({tried}). {accepted}")
    return fn


def resolve_reward_funcs(names: list[str] | None, task) -> list:
    """Reward callables for --reward_funcs (GRPO's and PPO's). Each name is looked up in order as: one of the task's
    built-in rewards; one of TRL's built-in reward names (rlhfkit.trl_rewards: think_format_reward,
    get_soft_overlong_punishment, accuracy_reward, reasoning_accuracy_reward); a reference (import_reward_function):
    "module:function", "path/to/file.py:function", or TRL's dotted "module.function".

    No names: the task's rule-based rewards (GRPO's default). No task and no names: an error (GRPO needs a reward).
    """
    builtin = dict(task.reward_funcs) if task is not None else {}
    if not names:
        if not builtin:
            raise ConfigError(
                "GRPO needs a reward: pass --reward_funcs module:function (or a built-in name with --task) and/or "
                "--reward_model_path PATH."
            )
        return list(builtin.values())
    funcs = []
    for name in names:
        if name in builtin:
            funcs.append(builtin[name])
        elif name in TRL_REWARDS:
            funcs.append(trl_reward_function(name))
        elif ":" in name or "." in name:
            funcs.append(import_reward_function(name))
        else:
            known = ", ".join(builtin) or "none without --task"
            raise ConfigError(
                f"--reward_funcs {name!r} is not a built-in reward of the task (built-in: {known}), nor one of TRL's "
                f"built-in rewards ({', '.join(TRL_REWARDS)}), nor a reference: {REFERENCE_FORMS}."
            )
    return funcs
