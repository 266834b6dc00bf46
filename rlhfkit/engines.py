"""DeepSpeed ZeRO and FSDP under `accelerate launch`: what an RL trainer needs on top of accelerate's engines.

accelerate prepares the trained model and its optimizer for the engine a launch config names
(examples/accelerate_configs/, TRL's file names). An RL run does more with its models than a supervised one, and
this module does that part, the same way for PPO and GRPO:

* **sampling** (:func:`gathered`): ZeRO-3 and FSDP keep 1/N of each weight per process and gather a layer's weights
  at every forward, a collective all processes must join. Token-by-token decoding runs a different number of steps
  on each process, so the policy's full weights are gathered once for the whole sampling phase (TRL's
  ``ds3_gather_for_generation``, on by default there) and decoding runs locally;
* **frozen models** (:func:`prepare_frozen`): the reference and the reward models are sharded for the same engine
  (ZeRO-3: a DeepSpeed engine without optimizer; FSDP: each transformer layer sharded with ``fully_shard``), so
  every process calls their forwards the same number of times (lockstep: :attr:`Engine.lockstep`); under ZeRO-1/2
  they are cast to the engine's bf16/fp16 weights, as the trained model's;
* **optimizer steps** (:func:`deepspeed_step`): DeepSpeed clips and steps inside ``accelerator.backward`` at the end
  of an accumulation (``sync_gradients``); the run reads the gradient norm and whether the step was applied;
* **checkpoints**: the full weights are gathered for ``save_pretrained`` (:func:`full_state_dict`), and the engine's
  own sharded model and optimizer state goes through ``accelerator.save_state`` / ``load_state``.

Models load whole in every process, then are sharded when prepared: ``zero3_init_flag`` and FSDP's
``cpu_ram_efficient_loading`` are turned off (docs/distributed.md says what that costs and why).

On machines without CUDA (tests, CPU clusters), accelerate only forms a process group for its DDP launcher and
starts every DeepSpeed or FSDP process alone. :func:`make_accelerator` forms the gloo group itself and, for FSDP,
switches accelerate to its FSDP path, so a launch never trains N independent copies.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from rlhfkit.errors import ConfigError


def name_deepspeed_accelerator() -> None:
    """On a machine without a CUDA device, tell DeepSpeed that its accelerator is the CPU (DS_ACCELERATOR=cpu), unless
    it is imported already or the variable is set. accelerate imports DeepSpeed whenever it is installed (to unwrap a
    model, which every save_pretrained does), and DeepSpeed then detects the CPU with a warning ("Setting accelerator
    to CPU...") on every run, a DeepSpeed config in use or not. The value is what it would detect."""
    if "DS_ACCELERATOR" not in os.environ and "deepspeed" not in sys.modules and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


@dataclass(frozen=True)
class Engine:
    """The engine `accelerate launch` asked for: "ddp" (or a single process), "deepspeed" or "fsdp"."""

    kind: str = "ddp"
    zero_stage: int = 0  # DeepSpeed's ZeRO stage
    fsdp_version: int = 0

    @classmethod
    def from_env(cls) -> Engine:
        """Read from the environment `accelerate launch --config_file` sets (ACCELERATE_USE_DEEPSPEED, ...)."""
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            return cls("deepspeed", zero_stage=int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")))
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
            return cls("fsdp", fsdp_version=int(os.environ.get("FSDP_VERSION", "1")))
        return cls()

    def __str__(self) -> str:
        if self.kind == "deepspeed":
            return f"DeepSpeed ZeRO stage {self.zero_stage}"
        if self.kind == "fsdp":
            return f"FSDP (version {self.fsdp_version})"
        return "DDP"

    @property
    def sharded(self) -> bool:
        """Whether the engine owns the model and optimizer state (their checkpoint is the engine's own format)."""
        return self.kind != "ddp"

    @property
    def lockstep(self) -> bool:
        """Whether weights are sharded across processes (ZeRO-3, FSDP): every forward of a prepared or frozen model
        is then a collective, so all processes must run the same forwards in the same order."""
        return self.kind == "fsdp" or (self.kind == "deepspeed" and self.zero_stage == 3)


def check_supported(
    engine: Engine,
    *,
    ds3_gather_for_generation: bool,
    sync_ref_model: bool,
    merge_adapter: bool,
    cache_implementation: str | None,
    load_in_4bit: bool,
    load_in_8bit: bool,
) -> None:
    """Exit 2 (ConfigError) for what rlhfkit does not do under `engine`, before anything is loaded or written."""
    if engine.kind == "fsdp" and engine.fsdp_version != 2:
        raise ConfigError(
            f"this run was launched under {engine}; rlhfkit shards with FSDP2 (torch's fully_shard), whose forwards "
            "the sampling loop can run on gathered weights. Launch with examples/accelerate_configs/fsdp2.yaml, or "
            "convert yours: accelerate to-fsdp2 --config_file YOUR.yaml --output_file fsdp2.yaml."
        )
    if engine.kind == "fsdp" and _torch_older(2, 6):
        raise ConfigError(f"FSDP2 needs torch >= 2.6 (this is {torch.__version__}): pip install -U torch.")
    if not engine.lockstep:
        return
    name = f"under {engine}"
    if not ds3_gather_for_generation:
        raise ConfigError(
            f"--ds3_gather_for_generation false {name}: rlhfkit samples from the policy's gathered weights (one "
            "full copy per process while sampling) and does not sample sharded. Leave it true; if the full policy "
            "does not fit one device, train a LoRA adapter (--use_peft) or use ZeRO-2."
        )
    if sync_ref_model:
        raise ConfigError(
            f"--sync_ref_model {name}: moving a sharded reference towards the policy is not supported. Use ZeRO-1/2 "
            "or DDP (multi_gpu.yaml) for TR-DPO, or leave sync_ref_model off."
        )
    if merge_adapter:
        raise ConfigError(
            f"--merge_adapter {name}: merging needs the whole base model in one process. Train without it and "
            "merge the saved adapter afterwards: PeftModel.from_pretrained(base_model, OUTPUT_DIR)"
            ".merge_and_unload().save_pretrained(MERGED_DIR)."
        )
    if cache_implementation == "static":
        raise ConfigError(
            f"--cache_implementation static {name}: the compiled decode step is built over the policy's whole weights "
            "and is not tested on weights gathered per generation. Leave it unset (the dynamic cache), or use DDP "
            "or ZeRO-1/2."
        )
    if load_in_4bit or load_in_8bit:
        raise ConfigError(
            f"--load_in_4bit / --load_in_8bit {name}: quantised weights are not sharded by rlhfkit. Use DDP "
            "(multi_gpu.yaml) with QLoRA, or ZeRO-3 / FSDP2 with --use_peft on bf16 weights."
        )


def _torch_older(major: int, minor: int) -> bool:
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version < (major, minor)


def make_accelerator(
    precision: str,
    trackers,
    *,
    per_device_train_batch_size: int,
    max_grad_norm: float | None,
    ds3_gather_for_generation: bool,
    sync_ref_model: bool,
    merge_adapter: bool,
    cache_implementation: str | None,
    load_in_4bit: bool,
    load_in_8bit: bool,
) -> tuple[Accelerator, Engine]:
    """The run's Accelerator for the engine `accelerate launch` asked for, with every process joined to one process
    group, and that engine; what rlhfkit does not do under it is refused first (check_supported).

    DeepSpeed and FSDP get their plugins from the launch config's environment, with zero3_init_flag and
    cpu_ram_efficient_loading off (models load whole, then are sharded when prepared); a DeepSpeed JSON names its ZeRO
    stage itself. Without CUDA, DDP joins through accelerate's cpu mode (gloo); DeepSpeed and FSDP through a gloo
    group formed here, FSDP2 then switched on by :func:`_shard_on_cpu`. DeepSpeed's batch settings are filled from the
    run's flags (:func:`_configure_deepspeed`).
    """
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, InitProcessGroupKwargs

    engine = Engine.from_env()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    multi_cpu = not torch.cuda.is_available() and world_size > 1
    kwargs: dict = {}
    if engine.kind == "deepspeed":  # its plugin reads a DeepSpeed JSON, which may name the stage
        kwargs["deepspeed_plugin"] = plugin = DeepSpeedPlugin(zero3_init_flag=False)
        engine = Engine("deepspeed", zero_stage=int(plugin.zero_stage))
    check_supported(
        engine,
        ds3_gather_for_generation=ds3_gather_for_generation,
        sync_ref_model=sync_ref_model,
        merge_adapter=merge_adapter,
        cache_implementation=cache_implementation,
        load_in_4bit=load_in_4bit,
        load_in_8bit=load_in_8bit,
    )
    if engine.kind == "fsdp":
        # sync_module_states broadcasts rank 0's weights, which every process loaded anyway; accelerate cannot do it
        # without an accelerator device.
        sync = {} if torch.cuda.is_available() else {"sync_module_states": False}
        # The engine's checkpoint (accelerate.save_state, for resuming) is each process's shard, written by torch's
        # distributed checkpoint: a full state dict would gather the whole optimizer state on one process. The full
        # weights are saved apart (full_state_dict), whatever the config's fsdp_state_dict_type.
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            cpu_ram_efficient_loading=False, state_dict_type="SHARDED_STATE_DICT", **sync
        )
    if multi_cpu and engine.sharded:
        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    cpu = multi_cpu and not engine.sharded
    accelerator = Accelerator(log_with=trackers or None, cpu=cpu, mixed_precision=precision, **kwargs)
    if engine.kind == "fsdp" and accelerator.distributed_type != DistributedType.FSDP:
        _shard_on_cpu(accelerator, kwargs["fsdp_plugin"])
    if engine.kind == "fsdp":
        _keep_output_dtypes(kwargs["fsdp_plugin"])
    if engine.kind == "deepspeed":
        _configure_deepspeed(accelerator, per_device_train_batch_size, max_grad_norm)
    return accelerator, engine


def _keep_output_dtypes(plugin) -> None:
    """FSDP2's sharded modules return their outputs in the dtype they computed them in. accelerate's mixed-precision
    policy casts every output to bf16 (output_dtype), which would round the float32 log-probs and values the
    trainers' forwards return (a log-prob of -20 by up to 0.06, a ratio off by 6%) and make the policy's log-probs
    differ from the frozen reference's."""
    policy = plugin.mixed_precision_policy
    if dataclasses.is_dataclass(policy) and getattr(policy, "output_dtype", None) is not None:
        plugin.mixed_precision_policy = dataclasses.replace(policy, output_dtype=None)


def _shard_on_cpu(accelerator: Accelerator, plugin) -> None:
    """Turn accelerate's state to FSDP where it left it out: accelerate takes the FSDP path only on accelerator
    devices, and on CPUs would prepare each process's model alone (DistributedType.NO). torch's fully_shard works
    over gloo, and accelerate's FSDP2 preparation only needs the state to say FSDP."""
    from accelerate.state import AcceleratorState, PartialState

    if accelerator.num_processes < 2:
        raise ConfigError(
            "FSDP needs at least 2 processes; this launch started 1. Set num_processes in the config (or "
            "--num_processes), or drop the FSDP config for a single process."
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin


def _configure_deepspeed(
    accelerator: Accelerator, per_device_train_batch_size: int, max_grad_norm: float | None
) -> None:
    """Fill the DeepSpeed config's batch settings from the run's flags, and refuse settings rlhfkit owns.

    accelerate fills "auto" batch sizes from dataloaders, which an RL trainer does not prepare: the micro-batch is
    --per_device_train_batch_size. rlhfkit accumulates micro-batches itself and tells DeepSpeed where an optimizer
    step ends (accelerator.sync_gradients), so DeepSpeed's own gradient_accumulation_steps stays 1 (it would divide
    the loss a second time); gradient clipping is --max_grad_norm; the optimizer and the learning-rate schedule are
    rlhfkit's (--optim, --lr_scheduler_type)."""
    plugin = accelerator.state.deepspeed_plugin
    config = plugin.deepspeed_config
    # accelerate registers the config with transformers, whose from_pretrained then builds every model partitioned
    # (zero.Init) under ZeRO-3, even with zero3_init_flag off; rlhfkit's models load whole and are sharded when
    # prepared (a partitioned model cannot be copied into the reference, nor sampled without gathering).
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    plugin.dschf = None
    clipping = max_grad_norm if max_grad_norm is not None else 0.0
    owned = {
        "train_micro_batch_size_per_gpu": (per_device_train_batch_size, "--per_device_train_batch_size"),
        "gradient_accumulation_steps": (1, "--gradient_accumulation_steps (rlhfkit accumulates itself)"),
        "gradient_clipping": (clipping, "--max_grad_norm"),
    }
    for key, (value, flag) in owned.items():
        given = config.get(key, "auto")
        if given != "auto" and given != value:
            raise ConfigError(
                f"the DeepSpeed config sets {key}={given!r}, but rlhfkit takes it from {flag} ({value!r}). Remove "
                f'{key} from the DeepSpeed config (or set it to "auto") and use {flag.split(" ")[0]}.'
            )
        config[key] = value
    config["train_batch_size"] = per_device_train_batch_size * accelerator.num_processes
    for key, flag in (("optimizer", "--optim"), ("scheduler", "--lr_scheduler_type")):
        if key in config:
            raise ConfigError(
                f"the DeepSpeed config has a {key!r} section, but rlhfkit builds the {key} itself ({flag}). Remove "
                "that section from the DeepSpeed config."
            )
    zero = config.setdefault("zero_optimization", {})
    if zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None):
        zero_force = "zero_force_ds_cpu_optimizer"  # accelerate's torch AdamW steps the offloaded fp32 weights
        config.setdefault(zero_force, False)
    if plugin.zero_stage == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save", False):
        # save_pretrained needs the full weights gathered; without it accelerate.get_state_dict refuses.
        zero["stage3_gather_16bit_weights_on_model_save"] = True


# ---------------------------------------------------------------------------------------------------------------------
# Sampling, frozen models, optimizer steps, checkpoints
# ---------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gathered(accelerator: Accelerator, engine: Engine, model: nn.Module) -> Iterator[nn.Module]:
    """The prepared `model`, unwrapped, with its full weights on every process for the duration of the block (a
    collective on entry and exit): forwards inside run locally, as many as each process needs, without gradients.

    ZeRO-3: the weights are gathered and DeepSpeed's per-module fetch/release hooks are lifted meanwhile (they would
    re-partition each layer after its forward). FSDP2: every sharded module is unsharded and told not to reshard
    after its forward until the block ends. Elsewhere the weights are whole already."""
    unwrapped = accelerator.unwrap_model(model)
    if engine.kind == "deepspeed" and engine.zero_stage == 3:
        with _zero3_gathered(model):
            yield unwrapped
    elif engine.kind == "fsdp":
        with _fsdp2_unsharded(unwrapped):
            yield unwrapped
    else:
        yield unwrapped


@contextlib.contextmanager
def _zero3_gathered(engine_model) -> Iterator[None]:
    import deepspeed

    offload = engine_model.optimizer.parameter_offload
    params = list(engine_model.module.parameters())
    for p in params:
        p.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    try:
        with deepspeed.zero.GatheredParameters(params):
            yield
    finally:
        offload._register_deepspeed_module(offload.module)


@contextlib.contextmanager
def _fsdp2_unsharded(model: nn.Module) -> Iterator[None]:
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    reshard = {m: _reshards_after_forward(m) for m in sharded}
    # The gathered weights land in buffers FSDP2 allocates once and refills at every unshard: allocated under
    # inference mode (evaluation runs in it) they could not be refilled by a training forward, so not there.
    with torch.inference_mode(False):
        # FSDP2 makes the first module to run a forward the root of the tree; sampling calls the policy inside the
        # prepared module, so name the prepared module the root first (torch's own lazy init, run once).
        if isinstance(model, FSDPModule):
            model._get_fsdp_state()._lazy_init()
        for m in sharded:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
    try:
        yield
    finally:
        with torch.inference_mode(False):
            for m in sharded:
                m.reshard()
                m.set_reshard_after_forward(reshard[m], recurse=False)


def _reshards_after_forward(module) -> bool:
    """An FSDP2 module's reshard_after_forward (torch keeps it as its post-forward mesh: None = keep unsharded)."""
    group = module._get_fsdp_state()._fsdp_param_group
    return group is None or group.post_forward_mesh_info is not None


def process_share(size: int, index: int, processes: int, lockstep: bool) -> tuple[list[int], int]:
    """The rows of a `size`-row dataset that process `index` of `processes` takes (every processes-th, from its index),
    and how many of them are its own. With `lockstep` every process gets ceil(size / processes) rows, a shorter share
    padded with repeats of its first row (or row 0), which the caller leaves out of what it reports."""
    rows = list(range(index, size, processes))
    own = len(rows)
    if lockstep and size:
        rows += [rows[0] if rows else 0] * (-(-size // processes) - own)
    return rows, own


def prepare_frozen(accelerator: Accelerator, engine: Engine, model: nn.Module, keep: list) -> nn.Module:
    """A frozen model (reference, reward model) on the run's device, prepared for `engine`; returns the module to
    call. `keep` collects what must stay alive beside it (a DeepSpeed engine).

    ZeRO-3: a DeepSpeed engine of stage 3 without optimizer shards it (its modules gather their weights in their
    forwards). FSDP2: each transformer layer is sharded with fully_shard; the rest (embeddings, norms, heads: small)
    stays whole, so a head can be called apart from its backbone. ZeRO-1/2: the weights are cast to the engine's
    bf16/fp16, as DeepSpeed casts the trained model's (no autocast under DeepSpeed)."""
    model = model.eval().requires_grad_(False)
    if engine.kind == "deepspeed":
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        if engine.zero_stage == 3:
            import deepspeed

            frozen_config = {
                k: copy.deepcopy(v)
                for k, v in config.items()
                if k in ("bf16", "fp16", "zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")
            }
            frozen_config["zero_optimization"] = {
                "stage": 3,
                "stage3_gather_16bit_weights_on_model_save": False,
                **{k: v for k, v in config["zero_optimization"].items() if k.startswith("stage3_") and v != "auto"},
            }
            frozen_config["gradient_accumulation_steps"] = 1
            ds_engine, *_ = deepspeed.initialize(model=model.to(accelerator.device), config=frozen_config)
            keep.append(ds_engine)
            return ds_engine.module.eval()
        return _cast_parameters(model.to(accelerator.device), _deepspeed_dtype(config))
    if engine.kind != "fsdp":
        return model.to(accelerator.device)
    from torch.distributed.fsdp import fully_shard

    # FSDP's mixed precision computes with the trained model's weights in param_dtype (norms and embeddings
    # included, which autocast leaves in fp32): frozen weights in that dtype compute the same, and the KL to the
    # reference starts at 0.
    policy = getattr(accelerator.state.fsdp_plugin, "mixed_precision_policy", None)
    model = _cast_parameters(model.to(accelerator.device), getattr(policy, "param_dtype", None))
    layers = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in layers:
            fully_shard(module)
    return model


def _cast_parameters(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """`model` with its parameters in `dtype` (None: unchanged) and its buffers as they are, as DeepSpeed and FSDP
    cast a trained model: RoPE's inverse frequencies stay fp32 (cast too, positions would rotate differently)."""
    if dtype is not None:
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return model


def _deepspeed_dtype(config: dict) -> torch.dtype | None:
    if config.get("bf16", {}).get("enabled") is True:
        return torch.bfloat16
    if config.get("fp16", {}).get("enabled") is True:
        return torch.float16
    return None


def full_state_dict(accelerator: Accelerator, engine: Engine, model: nn.Module) -> dict | None:
    """The prepared `model`'s full state dict on the main process (a collective under ZeRO-3 and FSDP, which gather
    it there), for save_pretrained(state_dict=...); None where the unwrapped model's own weights are whole."""
    if not engine.sharded:
        return None
    state = accelerator.get_state_dict(model)
    # Gathered tensors are copies: transformers would save a tied weight (lm_head = embed_tokens) twice, since it
    # recognises ties by shared storage. Keep the first name of each tied parameter, as the model's own save does.
    unwrapped = accelerator.unwrap_model(model)
    kept = {name for name, _ in unwrapped.named_parameters()}
    tied = {name for name, _ in unwrapped.named_parameters(remove_duplicate=False)} - kept
    return {k: v for k, v in state.items() if k not in tied} if accelerator.is_main_process else state


def substate(state: dict | None, prefix: str) -> dict | None:
    """The entries of `state` under `prefix` ("policy."), with the prefix removed."""
    if state is None:
        return None
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def deepspeed_step(model) -> tuple[float, bool, float | None]:
    """(gradient norm before clipping, whether the step changed the weights, the fp16 loss scale or None) of the step
    DeepSpeed took at the end of the accumulation (inside accelerator.backward); DeepSpeed skips a NaN/inf gradient
    as an overflow."""
    norm = model.get_global_grad_norm()
    norm = float(norm.item() if hasattr(norm, "item") else norm) if norm is not None else float("nan")
    fp16 = model.fp16_enabled()
    scale = float(getattr(model.optimizer, "loss_scale", 1.0)) if fp16 else None
    return norm, bool(model.was_step_applied()), scale
