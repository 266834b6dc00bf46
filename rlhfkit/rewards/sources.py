"""The reward sources a trainer scores completions with (reward functions and reward models), their names, weights
and metrics, and the window that averages what the functions log."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlhfkit.errors import ConfigError, RewardFunctionError
from rlhfkit.metrics import registry as M
from rlhfkit.metrics.accumulate import MetricAccumulator
from rlhfkit.models import DEFAULT_HUB, Hub, load_reward_model
from rlhfkit.rewards.calling import RewardOutput, _as_number, score_completions, takes_trainer_kwargs, weighted_total
from rlhfkit.rewards.reward_models import RewardModelFunction


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
                "log_metric": functools.partial(self._log_metric, call_metrics),
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

    def _log_metric(self, call_metrics: dict, name: str, value) -> None:
        """log_metric(name, value) as a reward function calls it."""
        own = {m.name for pair in self.metrics for m in pair}
        if not isinstance(name, str) or not name:
            raise RewardFunctionError(f"log_metric: the metric name must be a non-empty str, not {name!r}.")
        registered = {name, f"eval/{name}"} & M.REGISTRY.keys()  # an evaluation logs it as eval/<name>
        if name in own or registered and name not in M.LOGGED_BY_REWARD_FUNCTIONS:
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
