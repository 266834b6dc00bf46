"""Asynchronous generation: a worker process samples completions with its own copy of the policy while the trainer
optimises (--async_generation, PPO's and GRPO's; docs/async.md).

The trainer asks for one generation at a time (`_Request`: prompts' token ids, or with tools the dataset rows, the
policy version the worker must sample with, and optionally the sampler's RNG state) through a multiprocessing queue,
and the worker answers in order (`_Result`: the sampler's Chunks, with its log-probs, and the version it used). New weights travel
over a private two-rank gloo process group (TCPStore + ProcessGroupGloo, apart from accelerate's), one flat tensor
per dtype, sent just before the request that needs them; the worker receives them when it reaches that request, so
every generation is sampled with exactly the version named in it. The trainer bounds staleness by how far ahead it asks
(`AsyncGeneration.next_generation`), and notices a dead worker while waiting (`GenerationWorkerDied`).

Multi-turn episodes (tools, environments) run whole in the worker: it gets a copy of the trainer's ToolEpisodes with
the policy (tokenizer, tools, environment factories and their pooled instances, restored from a checkpoint on resume),
samples each generation's episodes with agents.episodes.sample_episodes, calls the tools there, and sends back the
episodes' messages and tool statistics, the rows as their episodes began and the environments' pool after them. The
episodes' instances travel back as copies in the same message as the pool (one pickle, made as the worker sends it
(`snapshot`): the rows name the pool's very instances), so the trainer's reward functions, get_reward and checkpoints
see the worker's state after the generation.

Scoring stays in the trainer: reward functions, reward models and the metrics never leave its process.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import queue
import random
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from transformers import GenerationConfig

from rlhfkit import perf
from rlhfkit.errors import ConfigError, GenerationWorkerDied
from rlhfkit.metrics import registry as M
from rlhfkit.sampling import Chunk, complete

_POLL_S = 1.0  # how often the trainer checks that the worker is alive while waiting for a generation
_CONNECT_TIMEOUT = timedelta(minutes=10)  # the worker's start (imports, model) and each weight transfer


# The worker's messages: a request per generation, answered in order by a result or a failure. Private to this
# module: what a trainer gets from a generation is its Chunks (next_generation).
@dataclass
class _Request:
    index: int  # the generation, counted from the start of training
    prompt_ids: list[list[int]] | None  # this process's prompts (GRPO: G copies of each), in order; None with rows
    rows: list[dict] | None  # with episodes (tools, environments): the dataset rows the episodes begin from
    batch_size: int  # prompts per sampling chunk
    version: int  # the optimizer steps behind the weights to sample with
    weights: bool  # new weights precede this request on the gloo group
    rng: dict[str, Any] | None  # the generation's RNG state to start from (None: continue the worker's own)


@dataclass
class _Result:
    index: int
    version: int
    chunks: list[Chunk]  # prompts, completions and the sampler's log-probs, on the CPU, chunk by chunk
    rng: dict[str, Any]  # the generation's RNG state after it
    generate_s: float  # seconds the worker spent sampling the generation
    idle_s: float  # seconds the worker waited for this request (held back by the staleness bound)
    weights_s: float  # seconds the worker spent receiving and loading weights for it
    messages: list[list[dict]] | None = None  # with episodes: each episode's messages after the prompt, in row order
    stats: list | None = None  # with episodes: each chunk's agents.episodes.ToolStats
    rows: list[dict] | None = None  # with episodes: the rows as their episodes began (environments: the instances)
    pool: dict | None = None  # with environments: the worker's pooled instances after the generation


def snapshot(message: _Result | _Failure) -> bytes:
    """`message` pickled now, as the worker's queue would pickle it (tensors by shared memory), so that what the trainer
    receives is the state at the moment of sending. A queue's put pickles later, in a feeder thread, by which time the
    worker may be resetting the same environment instances for the next generation (a pool that reads one generation
    ahead)."""
    return bytes(ForkingPickler.dumps(message))


@dataclass
class Generation:
    """A generation as a trainer receives it: its chunks (on the trainer's device), the rows it was asked with (with
    episodes: as their episodes began, the environments' instances under ``environments``), the episodes' messages
    (what the reward functions get; None for plain completions) and its staleness (optimizer steps between the weights
    that sampled it and the trainer's now)."""

    chunks: list[Chunk]
    rows: list[dict]
    messages: list[list[dict]] | None
    staleness: int


@dataclass
class _Failure:
    text: str  # the worker's traceback


def sampler_rng(device: torch.device) -> dict[str, Any]:
    """The RNG state a generation draws from: torch's CPU generator and the device's own on a GPU (sampling), and
    Python's and numpy's global ones (what tools and environments draw with: reset's random targets, say)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_sampler_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
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


@dataclass
class _Policy:
    """What the worker builds its copy of the policy from (the first message it receives)."""

    model_class: type
    model_config: Any
    generation_config: GenerationConfig
    state: dict[str, torch.Tensor]  # the whole state dict, on the CPU
    names: list[str]  # the parameters in the order the weights travel
    sampling: GenerationConfig
    episodes: bytes | None = None  # the trainer's agents.episodes.ToolEpisodes, pickled (None: plain completions)
    lean_heap: bool = False  # the trainer runs with --trim_cpu_heap (perf.lean_heap): so does the worker


def _worker_main(
    device: str, threads: int, autocast_dtype: torch.dtype | None, port: int, ready, requests, results
) -> None:
    """The worker process: import what sampling needs while the trainer is still being built, build the policy copy
    from the first message, say it is ready, join the trainer's gloo group, then answer requests in order until a
    None arrives."""
    try:
        if threads:
            torch.set_num_threads(threads)
        policy = requests.get()
        if policy is None:
            return
        model_class, model_config, state, names = policy.model_class, policy.model_config, policy.state, policy.names
        generation_config, sampling = policy.generation_config, policy.sampling
        episodes = None if policy.episodes is None else pickle.loads(policy.episodes)
        if policy.lean_heap:
            perf.lean_heap()
        target = torch.device(device)
        dtype = next(iter(state.values())).dtype if state else None
        attention = getattr(model_config, "_attn_implementation", None)
        model = model_class._from_config(model_config, dtype=dtype, attn_implementation=attention)
        model.load_state_dict(state)
        model.generation_config = generation_config
        model.to(target).eval()
        own = dict(model.named_parameters())
        params = [own[name] for name in names]
        buffers = [
            torch.empty(sum(params[i].numel() for i in g), dtype=params[g[0]].dtype) for g in _dtype_groups(params)
        ]
        ready.set()
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=_CONNECT_TIMEOUT)
        group = dist.ProcessGroupGloo(store, 1, 2, _CONNECT_TIMEOUT)  # the trainer joins with its first request
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
                if episodes is None:
                    chunks = [
                        c.to("cpu") for c in complete(model, request.prompt_ids, sampling, request.batch_size, target)
                    ]
                    sampled = {}
                else:
                    sampled = _sample_episodes(episodes, model, request.rows, sampling, request.batch_size, target)
                    chunks = sampled.pop("chunks")
            generate_s = time.perf_counter() - start
            result = _Result(
                request.index, request.version, chunks, sampler_rng(target), generate_s, idle, weights_s, **sampled
            )
            results.put(snapshot(result))
    except BaseException:
        results.put(snapshot(_Failure(traceback.format_exc())))
        raise


def _sample_episodes(episodes, model: nn.Module, rows: list[dict], sampling, batch_size: int, device) -> dict:
    """The worker's multi-turn generation: the episodes of `rows` sampled and their tools run here
    (agents.episodes.sample_episodes, as the synchronous trainer samples them), as _Result's fields."""
    from rlhfkit.agents.episodes import sample_episodes  # here: a worker of plain completions never needs the agents

    sampled, began = sample_episodes(episodes, model, rows, sampling, batch_size, device)
    environments = episodes.environments
    return {
        "chunks": [e.chunk.to("cpu") for e in sampled],
        "messages": [m for e in sampled for m in e.messages],
        "stats": [e.stats for e in sampled],
        "rows": began,
        "pool": None if environments is None else environments.pool,
    }


def _pickled_episodes(episodes) -> bytes:
    """The trainer's ToolEpisodes for the worker, pickled here so that what cannot travel is said at once, with the
    fix: tools and environment classes are sent by reference to their module, instances by value."""
    try:
        return pickle.dumps(episodes)
    except Exception as e:  # noqa: BLE001 - pickle raises PicklingError, AttributeError or TypeError by cause
        raise ConfigError(
            f"async_generation runs the tools and environments in the generation worker process, so they must be "
            f"picklable, and these are not ({type(e).__name__}: {e}). Define each tool function and environment class "
            "at the top level of a module (not inside a function, not a lambda), and keep what an environment holds "
            "picklable (open connections, locks and threads are not: make them in reset), or leave "
            "async_generation off."
        ) from None


def _kill(process) -> None:
    if process.is_alive():
        process.kill()
        process.join()


class AsyncGeneration:
    """The trainer's side: starts the worker, gives it the policy (`load`), asks for generations up to `max_staleness`
    ahead, sends weights, hands the generations back in order.

    The process starts at once, so that its imports (seconds) overlap with the rest of the trainer's construction.
    device: where it samples. threads: its torch threads (0: its default). autocast_dtype: the precision sampling
    runs under (accelerate's --bf16/--fp16 autocast), None for none.
    """

    def __init__(
        self, device: torch.device, max_staleness: int, threads: int = 0, autocast_dtype: torch.dtype | None = None
    ):
        self.device, self.max_staleness = device, max_staleness
        context = mp.get_context("spawn")
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=_CONNECT_TIMEOUT, wait_for_workers=False)
        self.requests, self.results, self._started = context.Queue(), context.Queue(), context.Event()
        self.process = context.Process(
            target=_worker_main,
            args=(str(device), threads, autocast_dtype, store.port, self._started, self.requests, self.results),
            daemon=True,
            name="rlhfkit-generation",
        )
        self.process.start()
        # A trainer whose construction fails after this point never calls close(): the worker ends with this object.
        self._finalizer = weakref.finalize(self, _kill, self.process)
        self._store = store
        self.group = None  # joined with the first request: the worker joins once it is ready
        self.params: list[torch.Tensor] = []
        self.sent_version = 0  # the version of the weights the worker holds (load)
        self.pending: collections.deque[tuple[int, list[dict]]] = collections.deque()  # (index, rows) asked, not taken
        self.next_index = 0
        self._sends: list = []  # the last weight transfer's (work, tensor): kept alive until it completes
        self.weight_sync_s = 0.0  # trainer seconds spent sending weights since the last take_weight_sync_s
        self.restore_threads = 0  # the trainer's torch threads before start_generation_worker split them (0: kept)
        self.start_wait_s = 0.0  # seconds the first request waited for the worker to start (until taken)
        self.episodes = None  # the trainer's ToolEpisodes when the worker samples multi-turn episodes

    def sample_episodes_with(self, episodes) -> None:
        """Have the worker sample multi-turn episodes with `episodes` (the trainer's ToolEpisodes: tools,
        environments) instead of plain completions; refused at once (ConfigError) when they cannot travel to it."""
        _pickled_episodes(episodes)
        self.episodes = episodes

    def load(self, policy: nn.Module, sampling: GenerationConfig, version: int) -> None:
        """Give the worker its copy of `policy` (unwrapped, whole weights: version `version`), the training sampler's
        GenerationConfig `sampling` and, for multi-turn episodes, a copy of the trainer's episodes (their tools and
        environments, the environments' state as now: a resumed run's restored one)."""
        self.params = [p for _, p in policy.named_parameters()]
        names = [name for name, _ in policy.named_parameters()]
        pickled = None if self.episodes is None else _pickled_episodes(self.episodes)
        state = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
        config, generation_config = policy.config, policy.generation_config
        lean = perf.heap_is_lean()
        self.requests.put(_Policy(type(policy), config, generation_config, state, names, sampling, pickled, lean))
        self.sent_version = version

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def request(self, rows: list[dict], batch_size: int, version: int, rng: dict | None) -> None:
        """Ask for one generation of the dataset `rows` (their ``input_ids``; with episodes, the rows themselves)
        sampled in chunks of `batch_size` with the weights of `version` (the trainer's current ones, sent now if the
        worker has older ones). The rows are kept and handed back with the generation."""
        if not self.process.is_alive():
            raise self._died(f"before the trainer asked for generation {self.next_index}")
        if self.group is None:  # the first request: join the worker's group once it has started
            start = time.perf_counter()
            while not self._started.wait(_POLL_S):
                if not self.process.is_alive():
                    raise self._died("while it started")
            self.group = dist.ProcessGroupGloo(self._store, 0, 2, _CONNECT_TIMEOUT)
            self.start_wait_s = time.perf_counter() - start
        weights = version != self.sent_version
        if weights:
            start = time.perf_counter()
            try:
                for work, _ in self._sends:
                    work.wait()
                flats = flatten_weights(self.params)
                self._sends = [(self.group.send([flat], 1, tag), flat) for tag, flat in enumerate(flats)]
            except RuntimeError as e:  # gloo: the connection closed
                raise self._died(f"while the trainer sent it the weights of update {version} ({e})") from None
            self.sent_version = version
            self.weight_sync_s += time.perf_counter() - start
        prompt_ids = None if self.episodes is not None else [r["input_ids"] for r in rows]
        sent_rows = rows if self.episodes is not None else None
        self.requests.put(_Request(self.next_index, prompt_ids, sent_rows, batch_size, version, weights, rng))
        self.pending.append((self.next_index, rows))
        self.next_index += 1

    def _receive(self) -> tuple[_Result, list[dict], float, int]:
        """The oldest generation asked for, waiting for it: its result, the rows it was asked with, the seconds waited
        and the generations ready in the queue when it was taken (itself included). Raises GenerationWorkerDied if the
        worker stops first."""
        index, rows = self.pending.popleft()
        start = time.perf_counter()
        while True:
            try:
                result = ForkingPickler.loads(self.results.get(timeout=_POLL_S))
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise self._died(f"while the trainer waited for generation {index}") from None
        wait_s = time.perf_counter() - start
        if isinstance(result, _Failure):
            raise GenerationWorkerDied(f"the generation worker failed on generation {index}:\n{result.text}")
        assert result.index == index, (result.index, index)
        return result, rows, wait_s, 1 + self._ready()

    def _died(self, when: str) -> GenerationWorkerDied:
        self.process.join(timeout=10)  # a killed process may not have been reaped yet: its exit code
        code = self.process.exitcode
        how = f"exited with code {code}" if code is not None else "stopped answering"
        hint = ""
        if not self._started.is_set():  # the usual cause: a script without the guard runs again in the worker
            hint = (
                ". A spawned worker imports the script that started training again: build the trainer under "
                '`if __name__ == "__main__":` (docs/async.md)'
            )
        return GenerationWorkerDied(f"the generation worker (pid {self.process.pid}) {how} {when}{hint}")

    def _ready(self) -> int:
        try:
            return self.results.qsize()
        except NotImplementedError:  # macOS
            return 0

    def take_weight_sync_s(self) -> float:
        value, self.weight_sync_s = self.weight_sync_s, 0.0
        return value

    def next_generation(self, run, ask: Callable[[], tuple[list[dict], int]]) -> Generation:
        """The trainer's next generation (Generation: chunks, rows, messages, staleness).

        First ask for generations until max_staleness + 1 are in flight, each on the current weights (run.progress.step
        updates), `ask()` giving the next generation's (dataset rows, chunk size); then take the oldest and log the
        asynchronous metrics into run.metrics, and with episodes their tool metrics (as the synchronous trainer logs
        them while sampling); with environments the trainer's pool becomes the worker's after this generation, which
        is what its checkpoints save. The first call waits for the worker to start (seconds: a new Python
        process imports torch and transformers), which the first update's perf/rollout_wait_s shows; the trainers
        start it first thing, so it imports while they load.

        max_staleness 0 hands the worker the sampler's RNG state with every request and takes the advanced state
        back, so it samples exactly what the synchronous trainer would; above 0 the worker continues its own RNG from
        the state of the first request (after start or resume). A dead worker stops the run with a checkpoint of
        the last finished update (run.stop_for_generation_worker)."""
        version = run.progress.step
        try:
            while self.in_flight < self.max_staleness + 1:
                rows, batch_size = ask()
                rng = sampler_rng(self.device) if self.max_staleness == 0 or self.next_index == 0 else None
                self.request(rows, batch_size, version, rng)
            result, rows, wait_s, queued = self._receive()
        except GenerationWorkerDied as e:
            run.stop_for_generation_worker(str(e))
        if self.max_staleness == 0:
            set_sampler_rng(result.rng, self.device)
        staleness = version - result.version
        chunks = [c.to(self.device) for c in result.chunks]
        m = run.metrics
        m.add(M.ASYNC_STALENESS_MEAN, staleness, 1)
        m.add_extreme(M.ASYNC_STALENESS_MAX, staleness)
        m.add(M.ASYNC_QUEUE_SIZE, queued, 1)
        m.add(M.ASYNC_ROLLOUT_WAIT, wait_s + self.start_wait_s, 1)  # the worker's start counts as waiting
        self.start_wait_s = 0.0
        m.add(M.ASYNC_BACKPRESSURE, result.idle_s, 1)
        tokens = sum(c.completion_mask.sum().item() for c in chunks)
        m.add(M.ASYNC_GENERATED_TOKENS_PER_S, tokens, result.generate_s)
        m.add(M.ASYNC_WEIGHT_SYNC, self.take_weight_sync_s(), 1)
        if result.stats is not None:
            from rlhfkit.agents.episodes import log_tool_stats  # as the worker imports it: with episodes only

            for stats in result.stats:
                log_tool_stats(m, stats)
        if result.pool is not None:
            self.episodes.environments.adopt(result.pool)
        return Generation(chunks, rows if result.rows is None else result.rows, result.messages, staleness)

    def close(self) -> None:
        """Stop the worker: at once if it is generating generations no one will take (they would only delay the end of
        the run), else after it reads the stop request."""
        if self.process.is_alive() and not self.pending:
            self.requests.put(None)
            self.process.join(timeout=30)
        self._finalizer()  # kills it if it is still alive
        self.requests.close()
        self.results.close()
        if self.restore_threads:
            torch.set_num_threads(self.restore_threads)


@contextlib.contextmanager
def generating(worker: AsyncGeneration | None) -> Iterator[None]:
    """Around a trainer's training loop: the generation worker (if any) is closed when the loop ends, however."""
    try:
        yield
    finally:
        if worker is not None:
            worker.close()


def start_generation_worker(run, args) -> AsyncGeneration:
    """The generation worker of a run, started before the trainer loads its models (it gets them with `load`). On a
    CPU, generation_threads 0 splits the trainer's torch threads between the two (the worker gets half, at least
    1); close() gives the trainer its threads back."""
    acc = run.accelerator
    threads, total = args.generation_threads, torch.get_num_threads()
    split = threads == 0 and acc.device.type == "cpu"
    if split:
        threads = max(1, total // 2)
        torch.set_num_threads(max(1, total - threads))
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(acc.mixed_precision))
    worker = AsyncGeneration(acc.device, args.max_staleness, threads=threads, autocast_dtype=autocast)
    worker.restore_threads = total if split else 0
    return worker
