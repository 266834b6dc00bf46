"""Asynchronous generation: a worker process samples completions with its own copy of the policy while the trainer
optimises (GRPO's --async_generation; docs/async.md).

The trainer asks for one generation round at a time (`RoundRequest`: prompts' token ids, the policy version the
worker must sample with, and optionally the sampler's RNG state) through a multiprocessing queue, and the worker
answers in order (`RoundResult`: the completions, the sampler's log-probs, the version it used). New weights travel
over a private two-rank gloo process group (TCPStore + ProcessGroupGloo, apart from accelerate's), one flat tensor
per dtype, sent just before the request that needs them; the worker receives them when it reaches that request, so
every round is sampled with exactly the version named in it. The trainer bounds staleness by how far ahead it asks
(`AsyncGeneration.next_round`), and notices a dead worker while waiting (`GenerationWorkerDied`).

Scoring stays in the trainer: reward functions, reward models and the metrics never leave its process.
"""

from __future__ import annotations

import collections
import queue
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from transformers import GenerationConfig

from rlhfkit.sampling import Chunk, Completions, complete

_POLL_S = 1.0  # how often the trainer checks that the worker is alive while waiting for a round
_CONNECT_TIMEOUT = timedelta(minutes=10)  # the worker's start (imports, model) and each weight transfer


class GenerationWorkerDied(RuntimeError):
    """The generation worker exited (killed, out of memory, an error) while the trainer waited for a round."""


@dataclass
class RoundRequest:
    index: int  # the generation round, counted from the start of training
    prompt_ids: list[list[int]]  # this process's prompts, G copies of each, in order
    version: int  # the optimizer steps behind the weights to sample with
    weights: bool  # new weights precede this request on the gloo group
    rng: dict[str, torch.Tensor] | None  # the sampler's RNG state to start from (None: continue the worker's own)


@dataclass
class RoundResult:
    index: int
    version: int
    chunk: Chunk  # prompts, completions and the sampler's log-probs, on the CPU
    rng: dict[str, torch.Tensor]  # the sampler's RNG state after the round
    generate_s: float  # seconds the worker spent sampling the round
    idle_s: float  # seconds the worker waited for this request (held back by the staleness bound)
    weights_s: float  # seconds the worker spent receiving and loading weights for it


@dataclass
class _Failure:
    text: str  # the worker's traceback


def sampler_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """The RNG state sampling on `device` draws from: torch's CPU generator, and the device's own on a GPU."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_sampler_rng(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _dtype_groups(params: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of `params` grouped by dtype, in first-seen order: each group travels as one flat tensor."""
    groups: dict[torch.dtype, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p.dtype, []).append(i)
    return list(groups.values())


def flatten_weights(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One contiguous CPU copy per dtype group (gloo sends CPU tensors; the copy lets training go on meanwhile)."""
    return [torch.cat([params[i].detach().reshape(-1).cpu() for i in group]) for group in _dtype_groups(params)]


@torch.no_grad()
def load_flat_weights(params: Sequence[torch.Tensor], flats: Sequence[torch.Tensor]) -> None:
    for group, flat in zip(_dtype_groups(params), flats, strict=True):
        offset = 0
        for i in group:
            n = params[i].numel()
            params[i].copy_(flat[offset : offset + n].view_as(params[i]))
            offset += n


def _worker_main(
    model_class: type,
    model_config: Any,
    generation_config: GenerationConfig,
    state: dict[str, torch.Tensor],
    names: list[str],
    sampling: GenerationConfig,
    device: str,
    threads: int,
    autocast_dtype: torch.dtype | None,
    port: int,
    requests,
    results,
) -> None:
    """The worker process: build the policy copy, then answer requests in order until a None arrives."""
    try:
        if threads:
            torch.set_num_threads(threads)
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=_CONNECT_TIMEOUT)
        group = dist.ProcessGroupGloo(store, 1, 2, _CONNECT_TIMEOUT)
        target = torch.device(device)
        dtype = next(iter(state.values())).dtype if state else None
        model = model_class._from_config(model_config, dtype=dtype)
        model.load_state_dict(state)
        model.generation_config = generation_config
        model.to(target).eval()
        own = dict(model.named_parameters())
        params = [own[name] for name in names]
        buffers = [
            torch.empty(sum(params[i].numel() for i in g), dtype=params[g[0]].dtype) for g in _dtype_groups(params)
        ]
        while True:
            start = time.perf_counter()
            request = requests.get()
            if request is None:
                return
            idle = time.perf_counter() - start
            start = time.perf_counter()
            if request.weights:
                for tag, buffer in enumerate(buffers):
                    group.recv([buffer], 0, tag).wait()
                load_flat_weights(params, buffers)
            weights_s = time.perf_counter() - start
            if request.rng is not None:
                set_sampler_rng(request.rng, target)
            start = time.perf_counter()
            with torch.no_grad(), torch.autocast(target.type, autocast_dtype, enabled=autocast_dtype is not None):
                (chunk,) = complete(model, request.prompt_ids, sampling, len(request.prompt_ids), target)
            generate_s = time.perf_counter() - start
            results.put(
                RoundResult(
                    request.index,
                    request.version,
                    _to_cpu(chunk),
                    sampler_rng(target),
                    generate_s,
                    idle,
                    weights_s,
                )
            )
    except BaseException:
        results.put(_Failure(traceback.format_exc()))
        raise


def _to_cpu(chunk: Chunk) -> Chunk:
    c = chunk.completions
    return Chunk(
        chunk.prompt_ids.cpu(),
        chunk.prompt_mask.cpu(),
        Completions(c.ids.cpu(), c.mask.cpu(), c.terminated.cpu()),
        None if chunk.logprobs is None else chunk.logprobs.cpu(),
    )


def _chunk_to(chunk: Chunk, device: torch.device) -> Chunk:
    c = chunk.completions
    return Chunk(
        chunk.prompt_ids.to(device),
        chunk.prompt_mask.to(device),
        Completions(c.ids.to(device), c.mask.to(device), c.terminated.to(device)),
        None if chunk.logprobs is None else chunk.logprobs.to(device),
    )


@dataclass
class Received:
    """A round as the trainer takes it: the completions and what the asynchronous metrics need."""

    chunk: Chunk  # on the trainer's device
    context: Any  # what the trainer attached to the request (its prompts' rows)
    staleness: int  # optimizer steps between the weights that sampled it and the trainer's now
    queued: int  # rounds ready in the queue when the trainer took this one (this one included)
    wait_s: float  # seconds the trainer waited for it
    result: RoundResult


class AsyncGeneration:
    """The trainer's side: starts the worker, asks for rounds up to `max_staleness` ahead, sends weights, hands the
    rounds back in order.

    policy: the unwrapped policy with whole weights (its current weights are version `version`). sampling: the
    training sampler's GenerationConfig. threads: the worker's torch threads (0: its default). autocast_dtype: the
    precision sampling runs under (accelerate's --bf16/--fp16 autocast), None for none.
    """

    def __init__(
        self,
        policy: nn.Module,
        sampling: GenerationConfig,
        device: torch.device,
        max_staleness: int,
        version: int,
        threads: int = 0,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.device, self.max_staleness = device, max_staleness
        self.params = [p for _, p in policy.named_parameters()]
        names = [name for name, _ in policy.named_parameters()]
        state = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
        context = mp.get_context("spawn")
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=_CONNECT_TIMEOUT, wait_for_workers=False)
        self.requests, self.results = context.Queue(), context.Queue()
        self.process = context.Process(
            target=_worker_main,
            args=(
                type(policy),
                policy.config,
                policy.generation_config,
                state,
                names,
                sampling,
                str(device),
                threads,
                autocast_dtype,
                store.port,
                self.requests,
                self.results,
            ),
            daemon=True,
            name="rlhfkit-generation",
        )
        self.process.start()
        self._store = store
        self.group = dist.ProcessGroupGloo(store, 0, 2, _CONNECT_TIMEOUT)
        self.sent_version = version  # the worker starts with the weights it was built from
        self.pending: collections.deque[tuple[int, Any]] = collections.deque()  # (index, context) asked, not taken
        self.next_index = 0
        self._sends: list = []  # the last weight transfer's (work, tensor): kept alive until it completes
        self.weight_sync_s = 0.0  # trainer seconds spent sending weights since the last take_weight_sync_s

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def request(self, prompt_ids: list[list[int]], context: Any, version: int, rng: dict | None) -> None:
        """Ask for one round of `prompt_ids` sampled with the weights of `version` (the trainer's current ones,
        sent now if the worker has older ones). context: kept and handed back with the round."""
        weights = version != self.sent_version
        if weights:
            start = time.perf_counter()
            for work, _ in self._sends:
                work.wait()
            flats = flatten_weights(self.params)
            self._sends = [(self.group.send([flat], 1, tag), flat) for tag, flat in enumerate(flats)]
            self.sent_version = version
            self.weight_sync_s += time.perf_counter() - start
        self.requests.put(RoundRequest(self.next_index, prompt_ids, version, weights, rng))
        self.pending.append((self.next_index, context))
        self.next_index += 1

    def receive(self, version: int) -> Received:
        """The oldest round asked for, waiting for it; `version`: the trainer's current weights (for staleness).
        Raises GenerationWorkerDied if the worker stops first."""
        index, context = self.pending.popleft()
        start = time.perf_counter()
        while True:
            try:
                result = self.results.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise GenerationWorkerDied(
                        f"the generation worker (pid {self.process.pid}) exited with code {self.process.exitcode} "
                        f"while the trainer waited for generation round {index}"
                    ) from None
        wait_s = time.perf_counter() - start
        if isinstance(result, _Failure):
            raise GenerationWorkerDied(f"the generation worker failed on round {index}:\n{result.text}")
        assert result.index == index, (result.index, index)
        queued = 1 + self._ready()
        return Received(
            _chunk_to(result.chunk, self.device), context, version - result.version, queued, wait_s, result
        )

    def _ready(self) -> int:
        try:
            return self.results.qsize()
        except NotImplementedError:  # macOS
            return 0

    def take_weight_sync_s(self) -> float:
        value, self.weight_sync_s = self.weight_sync_s, 0.0
        return value

    def close(self) -> None:
        """Stop the worker (it finishes the round it is on) and release the group."""
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.requests.close()
        self.results.close()
