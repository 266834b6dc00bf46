"""Calling reward functions as TRL does (its calling convention, async functions, None and NaN where a function does
not apply) and checking what they return."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from rlhfkit.data import as_completions
from rlhfkit.errors import RewardFunctionError
from rlhfkit.logs import LOGGER
from rlhfkit.rewards.reward_models import RewardModelFunction


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

    A completion that no source scores gets 0, with a warning of the rlhfkit logger naming the first one, as TRL 1.16
    logs one (it sums the rewards with NaN left out): training goes on, and the warning says which prompt no function
    scored.
    """
    values = torch.stack([o.values for o in outputs])  # (K, N)
    applicable = torch.stack([o.applicable for o in outputs])
    w = torch.tensor(weights, dtype=torch.float64)[:, None]
    unscored = ~applicable.any(0)
    if unscored.any():
        i = int(unscored.nonzero()[0])
        LOGGER.warning(
            "every reward function returned None or NaN for %d of %d completions, e.g. completion %d (prompt %r): they "
            "get reward 0, as in TRL. Make at least one reward function score each completion.",
            int(unscored.sum()), len(prompts), i, prompts[i],
        )  # fmt: skip
    return torch.where(applicable, w * values, 0.0).sum(0)


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
