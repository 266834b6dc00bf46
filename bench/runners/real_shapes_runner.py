"""One run of bench/real_shapes.py: a library's GRPO or PPO trainer, one step, on a real-shape model; peak memory.

    PYTHON bench/runners/real_shapes_runner.py SPEC.json

SPEC.json (written by bench/real_shapes.py): ``library`` (rlhfkit | trl), ``trainer`` (grpo | ppo), ``paths`` (the
shape's policy/, reward/, tokenizer/, prompts/), ``settings`` (the config's fields, the same names on both sides, plus each
side's own), ``threads``, ``output_dir``, ``result`` (where to write RESULT.json), ``profile`` (mark phases, see
phase_memory.py).

Both libraries get the same models, loaded the same way (float32 from the shape's directories), and the same
prompts: GRPO the ``prompt`` column (each library tokenizes it; every prompt is PROMPT_TOKENS tokens, no special
tokens), PPO rlhfkit the ``prompt`` column and TRL 1.12 the same tokens as an ``input_ids`` column (as TRL's example
script prepares them). GRPO's reward is ``reward`` below (both libraries pass ``completion_ids``); PPO's is the
shape's reward model, which also initialises the value model (TRL's example script; rlhfkit takes value_model).
GRPO's reference: each library's own (TRL loads the policy's path again, rlhfkit copies the policy in memory); PPO's:
the policy's path loaded again and passed as ``ref_model`` to both.

The run is one optimizer step (GRPO) or one PPO update; the result holds the process's peak RSS before and after
``train()`` (``VmHWM``; the driver also reads ``ru_maxrss``), and with ``profile`` the per-phase peaks.
Standard library, torch, transformers, datasets and the library under test; rlhfkit's runs never import TRL and
TRL's never rlhfkit (asserted).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from phase_memory import PhaseMemory, hwm_mb, rss_mb  # noqa: E402

PROCESS_START = time.time()
COMPLETION_LENGTHS: list[int] = []  # every completion's token count, as the reward or the sampler saw it


def reward(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
    """A reward with spread inside every group (so advantages are not all zero), from the completion's tokens only."""
    COMPLETION_LENGTHS.extend(len(ids) for ids in completion_ids)
    return [float(sum(int(i) for i in ids) % 97) / 97.0 for ids in completion_ids]


def count_ppo_completions(library: str, trainer) -> None:
    """PPO's completion lengths (its reward is a model): the real tokens of each sampled completion."""
    if library == "rlhfkit":
        ppo = _ppo_modules()[0]  # where PPO samples

        original = ppo.complete

        def complete(*args, **kwargs):
            for chunk in original(*args, **kwargs):
                COMPLETION_LENGTHS.extend(chunk.completion_mask.sum(1).tolist())
                yield chunk

        ppo.complete = complete
        return
    from trl.experimental.ppo import ppo_trainer

    original = ppo_trainer.batch_generation

    def batch_generation(model, queries, *args, **kwargs):
        query_responses, logitss = original(model, queries, *args, **kwargs)
        COMPLETION_LENGTHS.extend([query_responses.shape[1] - queries.shape[1]] * query_responses.shape[0])
        return query_responses, logitss

    ppo_trainer.batch_generation = batch_generation


def load_models(paths: dict, trainer: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    fp32 = {"dtype": torch.float32}
    tok = AutoTokenizer.from_pretrained(paths["tokenizer"], padding_side="left")
    models = {"policy": AutoModelForCausalLM.from_pretrained(paths["policy"], **fp32)}
    if trainer == "ppo":
        models["ref"] = AutoModelForCausalLM.from_pretrained(paths["policy"], **fp32)
        models["reward"] = AutoModelForSequenceClassification.from_pretrained(paths["reward"], num_labels=1, **fp32)
        models["value"] = AutoModelForSequenceClassification.from_pretrained(paths["reward"], num_labels=1, **fp32)
    return tok, models


def build_rlhfkit(spec: dict, tok, models: dict, dataset):
    from rlhfkit import GRPOConfig, GRPOTrainer, PPOConfig, PPOTrainer

    settings = spec["settings"]
    if spec["trainer"] == "grpo":
        args = GRPOConfig(output_dir=spec["output_dir"], **settings)
        return GRPOTrainer(
            model=models["policy"], reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tok
        )
    args = PPOConfig(output_dir=spec["output_dir"], **settings)
    return PPOTrainer(
        args=args,
        processing_class=tok,
        model=models["policy"],
        ref_model=models["ref"],
        reward_model=models["reward"],
        value_model=models["value"],
        train_dataset=dataset,
        eval_dataset=dataset,
    )


def build_trl(spec: dict, tok, models: dict, dataset):
    settings = spec["settings"]
    if spec["trainer"] == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(output_dir=spec["output_dir"], **settings)
        return GRPOTrainer(
            model=models["policy"], reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tok
        )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenized = dataset.map(
        lambda row: {"input_ids": tok(row["prompt"], padding=False)["input_ids"]}, remove_columns=["prompt"]
    )
    args = PPOConfig(output_dir=spec["output_dir"], **settings)
    return PPOTrainer(
        args=args,
        processing_class=tok,
        model=models["policy"],
        ref_model=models["ref"],
        reward_model=models["reward"],
        value_model=models["value"],
        train_dataset=tokenized,
        eval_dataset=tokenized,
    )


# ---------------------------------------------------------------------------------------------------------------
# phases (profile): where each library's step spends its memory
def _generation_wrapped(memory: PhaseMemory) -> None:
    """rlhfkit's sampler (its own decoding loop; transformers' generate when it falls back) as "sampling", wherever
    it was imported by name (as bench/runners/rlhfkit_runner.py wraps it for timing)."""
    from transformers.generation.utils import GenerationMixin

    from rlhfkit.sampling import completions

    original = completions.generate
    wrapped = memory.wrap(original, "sampling")
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("rlhfkit") and getattr(module, "generate", None) is original:
            module.generate = wrapped
    inner = "sampling"
    memory.patch(GenerationMixin, "generate", lambda *a, **k: None if inner in memory.current() else "sampling")


def _ppo_modules():
    """(the module PPO samples and scores in, the module of PolicyAndValue): ppo/generation.py and ppo/model.py since
    House 3, trainers/ppo.py for both before."""
    try:
        from rlhfkit.trainers.ppo import generation, model

        return generation, model
    except ImportError:
        from rlhfkit.trainers import ppo

        return ppo, ppo


def patch_forward(memory: PhaseMemory, module, label: str) -> None:
    """The policy's forward as `module` calls it: completion_token_stats (log-probs with the LM head in chunks; named
    response_token_stats until House 3's rename), or response_logits (the (B, T, V) logits, before the LM head ran in
    chunks)."""
    names = ("completion_token_stats", "response_token_stats", "response_logits")
    name = next(n for n in names if hasattr(module, n))
    memory.patch(module, name, label)


def phases_rlhfkit(memory: PhaseMemory, trainer, kind: str) -> None:
    import torch

    from rlhfkit import ops

    _generation_wrapped(memory)
    memory.patch(ops, "logprobs_from_logits", "log-probs from logits")
    memory.patch(ops, "entropy_from_logits", "entropy from logits")
    memory.patch(trainer.rewards, "score", "rewards")
    memory.patch(trainer.accelerator, "backward", "backward")
    memory.patch(trainer.run, "optimizer_step", "optimizer step")
    from rlhfkit.trainers import run

    memory.patch(trainer.run, "save_checkpoint", "final checkpoint (train() saves it)")
    memory.patch(run, "save_into", "final model save (train() saves it)")
    if kind == "grpo":
        try:  # the layout since House 3: each algorithm in its folder
            from rlhfkit.trainers.grpo import generation as gen
            from rlhfkit.trainers.grpo import trainer as grpo
        except ImportError:  # a measured commit before it
            from rlhfkit.trainers import generation as gen
            from rlhfkit.trainers import grpo

        g = type(trainer.generation)
        memory.patch(g, "generate_and_score", "generation batch")
        memory.patch(g, "reference_logprobs", "reference log-probs")
        memory.patch(
            g, "logprobs", lambda *a, **k: None if "reference log-probs" in memory.current() else "old log-probs"
        )
        patch_forward(memory, gen, "model forward (logits)")
        patch_forward(memory, grpo, "training forward (logits)")
        memory.patch(ops, "grpo_per_token_loss", "loss")
        original = type(trainer).micro_step

        def micro_step(self, *args, **kwargs):
            with memory.phase("training micro-step"), memory.saved_tensors("training micro-step"):
                return original(self, *args, **kwargs)

        type(trainer).micro_step = micro_step
        return
    ppo, model = _ppo_modules()
    t = type(trainer)
    g = type(getattr(trainer, "generation", trainer))  # PPOGeneration since House 3, the trainer before
    memory.patch(g, "generate_and_score", "rollout")
    memory.patch(g, "reference_logprobs", "reference log-probs")
    patch_forward(memory, model, "model forward (logits)")
    if ppo is not model:  # the reference's forward, in the generation module
        patch_forward(memory, ppo, "model forward (logits)")
    memory.patch(ppo, "token_values", "value forward")
    memory.patch(
        model.PolicyAndValue,
        "forward",
        lambda *a, **k: "training forward (logits + values)" if torch.is_grad_enabled() else "old log-probs forward",
    )
    memory.patch(t, "shaped_rewards", "KL-shaped rewards")
    memory.patch(t, "advantages", "advantages (GAE)")
    memory.patch(ops, "clipped_policy_loss", "loss")
    memory.patch(ops, "clipped_value_loss", "loss")
    original = t.micro_step

    def micro_step(self, *args, **kwargs):
        with memory.phase("training micro-step"), memory.saved_tensors("training micro-step"):
            return original(self, *args, **kwargs)

    t.micro_step = micro_step


def phases_trl(memory: PhaseMemory, trainer, kind: str) -> None:
    import torch
    from transformers.generation.utils import GenerationMixin

    memory.patch(trainer.accelerator, "backward", "backward")
    memory.patch(torch.nn.utils, "clip_grad_norm_", "clip grad norm")

    # the optimizer step through torch's global step hooks (transformers' Trainer and TRL's PPO loop call step())
    def step_pre(*args):  # a pre-hook's return value would replace the step's arguments: return None
        if memory.enabled:
            memory.enter("optimizer step")

    def step_post(*args):
        if memory.enabled:
            memory.exit()

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(step_pre)
    register_optimizer_step_post_hook(step_post)
    if kind == "grpo":
        t = type(trainer)
        memory.patch(GenerationMixin, "generate", "sampling")
        memory.patch(t, "_generate_and_score_completions", "generation batch")
        memory.patch(t, "_calculate_rewards", "rewards")

        def logps_label(self, model, *args, **kwargs):
            if model is self.ref_model:
                return "reference log-probs"
            return "training forward (fused log-probs)" if torch.is_grad_enabled() else "old log-probs"

        memory.patch(t, "_get_per_token_logps_and_entropies", logps_label)
        original = t.compute_loss

        def compute_loss(self, *args, **kwargs):
            with memory.phase("loss forward"), memory.saved_tensors("training micro-step"):
                return original(self, *args, **kwargs)

        t.compute_loss = compute_loss
        return
    from trl.experimental.ppo import ppo_trainer as m

    memory.patch(m, "batch_generation", "sampling (generate, output_scores)")

    def forward_label(model, *args, **kwargs):
        if model is trainer.ref_model:
            return "reference forward (logits)"
        return "training forward (logits + values)" if torch.is_grad_enabled() else "policy forward"

    memory.patch(m, "forward", forward_label)
    memory.patch(
        m,
        "get_reward",
        lambda model, *a, **k: "reward model forward" if model is trainer.reward_model else "value forward",
    )
    memory.patch(m, "selective_log_softmax", "log-probs from logits")
    # the entropy of the training logits, computed after the optimizer step with a full softmax (TRL's metrics)
    memory.patch(
        torch.nn.functional,
        "softmax",
        lambda *a, **k: "entropy (metrics, full softmax)" if memory.current() == ["train"] else None,
    )


# ---------------------------------------------------------------------------------------------------------------
def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    import torch

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec.get("seed", 0)))
    from datasets import load_from_disk

    library, kind = spec["library"], spec["trainer"]
    tok, models = load_models(spec["paths"], kind)
    dataset = load_from_disk(spec["paths"]["prompts"])
    build = build_rlhfkit if library == "rlhfkit" else build_trl
    trainer = build(spec, tok, models, dataset)
    del models  # the trainer holds what it uses
    if kind == "ppo":
        count_ppo_completions(library, trainer)
    memory = PhaseMemory()
    if spec.get("profile"):
        (phases_rlhfkit if library == "rlhfkit" else phases_trl)(memory, trainer, kind)
    version = __import__(library).__version__
    before_hwm, before_rss = hwm_mb(), rss_mb()
    setup_seconds = time.time() - PROCESS_START
    t0 = time.perf_counter()
    if spec.get("profile"):
        memory.start()
        with memory.phase("train"):
            trainer.train()
        memory.stop()
        peak = max(memory.peak_mb, before_hwm)
    else:
        trainer.train()
        peak = hwm_mb()
    seconds = time.perf_counter() - t0
    other = "trl" if library == "rlhfkit" else "rlhfkit"
    assert other not in sys.modules, f"{library}'s run imported {other}"
    result = {
        "library": library,
        "version": version,
        "trainer": kind,
        "threads": torch.get_num_threads(),
        "peak_rss_mb": round(peak, 1),
        "peak_rss_before_train_mb": round(before_hwm, 1),
        "rss_at_train_start_mb": round(before_rss, 1),
        "train_seconds": round(seconds, 2),
        "completion_lengths": sorted(set(COMPLETION_LENGTHS)),
        "completions": len(COMPLETION_LENGTHS),
        "setup_seconds": round(setup_seconds, 2),
        "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "accelerate", "datasets")},
    }
    if spec.get("profile"):
        result["phases"] = memory.summary()
        result["saved_for_backward"] = memory.saved_summary()
    with open(spec["result"], "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k not in ("phases", "saved_for_backward")}))


if __name__ == "__main__":
    main()
