"""Build the built-in task's assets offline: tokenizer, SFT model, reward model, prompts and task.json (the layout
is tasks/layout.py's). The SFT model is a LlamaForCausalLM after a supervised warm start; the reward model a
LlamaForSequenceClassification with 1 label, initialised from it. A chat task (Task.chat: reverse-chat) gets the chat
tokenizer (tasks/chat_tokenizer.py) and conversational prompts; both models learn on the conversation as its template
renders it (model_inputs), the text the trainers generate from and PPO's reward model scores.

Reward-model loss (per batch of P pairs, r = score at the last non-pad token):
    L = mean_p[-log sigmoid(r_chosen - r_rejected)]                                   (Bradley-Terry)
      + calib_coef * mean_p[0.5 * ((r_chosen - m)^2 + (r_rejected + m)^2)]            (pointwise calibration)
The calibration term pins correct answers near +m and every wrong answer near -m. Why: with a ranking loss alone the
model orders one wrong answer against another arbitrarily, and RL exploits that noise (DESIGN section 4); a flat
floor for wrong answers leaves the policy only one way up: be correct. Pairs mix synthetic near misses with
completions sampled from the SFT model at several temperatures, so the model is trained on what a policy emits.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from filelock import FileLock

from rlhfkit.data import progress_bars_hidden, prompt_text
from rlhfkit.sampling import right_pad

from .agent_build import AGENT_PRESETS, build_agent
from .chat_tokenizer import build_chat_tokenizer
from .fitting import fit, model_config, seed_everything, torch_threads
from .layout import Assets, ensure_replaceable, install
from .presets import BuildPreset
from .registry import DEFAULT_TASK, TASKS
from .success import evaluate_success, generate_completions
from .tokenizer import build_tokenizer

BUILDER_VERSION = 2  # 2: the reverse and addition tasks got their own budgets in the default preset (TASK_BUDGETS)


PRESETS: dict[str, BuildPreset] = {
    "default": BuildPreset(),
    "test": BuildPreset(
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        n_train_prompts=256,
        n_test_prompts=32,
        sft_steps=40,
        sft_batch=32,
        rm_sample_prompts=32,
        rm_sample_temperatures=(1.0,),
        rm_samples_per_prompt=2,
        rm_synthetic_pairs=256,
        rm_steps=40,
        rm_batch=32,
        rm_lr=1e-3,
        eval_prompts=32,
        num_threads=1,
    ),
}


# The default preset's budgets for the tasks that need more than sort's, so that each task's SFT model starts near
# where sort's does and its reward model picks right answers out of the SFT model's own samples (seed 0; success greedy
# / sampled at 0.7 on the test prompts; sort: 45% / 36%, its reward model ranks 97% of the pairs of SFT samples right
# and best-of-8 by its score succeeds on 59%). With sort's budgets reverse started at 13% / 2% and addition at 1% / 1%,
# with reward models whose best-of-8 was no better than plain sampling: too little to reinforce. Supervised success
# jumps within a few dozen steps: reverse 140 steps -> 50% / 24%, 150 -> 56% / 27%, 175 -> 81% / 63%; addition
# 350 -> 22% / 13%, 365 -> 40% / 38%, 400 -> 90% / 75%. Reward models (pairs of SFT samples ranked right, best-of-8
# against plain sampling): reverse, 300 steps 60%, 22% vs 32%; 1000 steps 69%, 25%; 1000 steps with the samples of
# 2000 prompts instead of 512: 88%, 47%. Addition: 54%, 23% vs 32%; 73%, 39%; 81%, 49%; 2000 steps 83%, 47%. A
# learning rate of 1e-3 was worse on both with 2000 prompts (58% and 55%).
# reverse-chat (the reverse task in the chat template) learns faster than reverse, and its greedy success runs far
# ahead of its sampled success: supervised steps 50 -> 1% / 0%, 60 -> 6% / 0%, 70 -> 29% / 2%, 75 -> 48% / 6%,
# 78 -> 57% / 7%, 80 -> 69% / 9%, 84 -> 77% / 16%, 87 -> 90% / 27%, 90 -> 90% / 31%, 105 -> 100% / 66%, 150 -> 99% /
# 91% (one sample per test prompt). Full builds, each with reverse's reward-model budget (1000 steps, the samples of 2000
# prompts): 150 steps, reward model 87% on pairs of SFT samples, best-of-8 91% vs 91% (nothing left to learn); 78 steps,
# 57% / 5% (8 samples per prompt), 87%, best-of-8 14% vs 5%, and a short PPO run (7680 episodes) fell from 57% to 30%
# greedy success: too few right samples to reinforce; 84 steps, 77% / 15%, 93%, best-of-8 41% vs 15%.
TASK_BUDGETS: dict[str, dict] = {
    "reverse": {"sft_steps": 150, "rm_steps": 1000, "rm_sample_prompts": 2000},
    "addition": {"sft_steps": 365, "rm_steps": 1000, "rm_sample_prompts": 2000},
    "reverse-chat": {"sft_steps": 84, "rm_steps": 1000, "rm_sample_prompts": 2000},
    "code": {"sft_steps": 150, "rm_steps": 100, "rm_sample_prompts": 256, "num_threads": 1},
}
# code (tasks/code.py; GRPO trains it through the sandbox's code_reward, so its reward model only serves PPO and the
# judge, hence the small budget): supervised steps -> test pass rate (code_reward) / exact match, greedy and sampled at
# 0.7, on 128 test prompts, seed 0: 70 -> 3% / 0%, 2% / 0% (the operators right, the constants not yet copied); 150 ->
# 74% / 73%, 17% / 14%; 250 -> 100% everywhere. One torch thread: 150 steps took 33 s beside other work, against 195 s
# for 70 steps with two.


def train_sft(tokenizer, train_examples, preset: BuildPreset, seed: int, log):
    """Supervised warm start on "prompt + answer + EOS"; cross-entropy on the answer and EOS tokens only."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(model_config(tokenizer, preset, tokenizer.model_max_length))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    encoded = []
    for prompt, answer in train_examples:
        p, a = tokenizer(prompt)["input_ids"], tokenizer(answer)["input_ids"]
        encoded.append((p + a + [tokenizer.eos_token_id], len(p)))

    def loss_of(idx: list[int]):
        ids, mask = right_pad([encoded[i][0] for i in idx], tokenizer.pad_token_id)
        labels = ids.clone()
        for row, i in enumerate(idx):
            labels[row, : encoded[i][1]] = -100  # no loss on the prompt
        labels[~mask] = -100
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        return loss, lambda: f"loss {loss.item():.4f}"

    fit(model, "sft", preset.sft_steps, preset.sft_lr, preset.sft_batch, len(encoded), seed, loss_of, 50, log)
    return model


def encode_completion(tokenizer, prompt: str, completion: str, ended: bool = True) -> list[int]:
    """Token ids of prompt + completion (+ EOS when the response ended with one): what a reward model scores."""
    ids = tokenizer(prompt + completion)["input_ids"]
    return ids + [tokenizer.eos_token_id] if ended else ids


@torch.no_grad()
def score_sequences(reward_model, seqs: list[list[int]], pad_id: int, batch_size: int = 256) -> torch.Tensor:
    """(N,) reward-model scores, read at each sequence's last non-pad token (right padding, positions from 0)."""
    was_training = reward_model.training
    reward_model.eval()
    out = []
    for start in range(0, len(seqs), batch_size):
        ids, mask = right_pad(seqs[start : start + batch_size], pad_id)
        out.append(reward_model(input_ids=ids, attention_mask=mask.long()).logits[:, 0].float())
    reward_model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


def _synthetic_pairs(task, tokenizer, prompts: list[str], n: int, rng: random.Random) -> list[tuple[list, list]]:
    """(chosen, rejected) token-id pairs: the gold answer vs a near miss; 15% of rejections also lack the EOS."""
    pairs = []
    for i in range(n):
        prompt = prompts[i % len(prompts)]
        gold = task.answer(prompt)
        wrong = task.corrupt(prompt, gold, rng)
        ended = rng.random() >= 0.15
        pairs.append((encode_completion(tokenizer, prompt, gold), encode_completion(tokenizer, prompt, wrong, ended)))
    return pairs


def _policy_pairs(task, tokenizer, prompts, comps, num_samples: int) -> list[tuple[list, list]]:
    """(gold, sampled wrong completion) pairs from `num_samples` samples per prompt (duplicates kept: frequent
    mistakes weigh more, as they would in RL)."""
    pairs = []
    for i, prompt in enumerate(prompts):
        gold = encode_completion(tokenizer, prompt, task.answer(prompt))
        for j in range(num_samples):
            k = i * num_samples + j
            if not (comps.terminated[k] and task.check(prompt, comps.texts[k])):
                pairs.append((gold, encode_completion(tokenizer, prompt, comps.texts[k], comps.terminated[k])))
    return pairs


def pair_accuracy(reward_model, pairs, pad_id: int) -> float:
    """Fraction of pairs with score(chosen) > score(rejected); ties count as wrong."""
    if not pairs:
        return float("nan")
    chosen = score_sequences(reward_model, [c for c, _ in pairs], pad_id)
    rejected = score_sequences(reward_model, [r for _, r in pairs], pad_id)
    return (chosen > rejected).float().mean().item()


def train_reward_model(sft_model, tokenizer, pairs, preset: BuildPreset, seed: int, log):
    """LlamaForSequenceClassification (1 label) from the SFT weights with a zero-initialised score head, trained
    with Bradley-Terry + calibration (module docstring)."""
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed + 1)
    config = model_config(tokenizer, preset, tokenizer.model_max_length, num_labels=1)
    rm = LlamaForSequenceClassification(config)
    rm.model.load_state_dict(sft_model.model.state_dict())
    torch.nn.init.zeros_(rm.score.weight)  # start neutral: every sequence scores 0
    m, pad_id = preset.rm_margin, tokenizer.pad_token_id

    def loss_of(idx: list[int]):
        ids, mask = right_pad([pairs[i][0] for i in idx] + [pairs[i][1] for i in idx], pad_id)
        scores = rm(input_ids=ids, attention_mask=mask.long()).logits[:, 0]
        chosen, rejected = scores[: len(idx)], scores[len(idx) :]
        bt = -F.logsigmoid(chosen - rejected).mean()
        calib = 0.5 * ((chosen - m) ** 2 + (rejected + m) ** 2).mean()
        accuracy = (chosen > rejected).float().mean()
        return (
            bt + preset.rm_calib_coef * calib,
            lambda: f"bt {bt.item():.4f} calib {calib.item():.4f} acc {accuracy.item():.3f}",
        )

    fit(rm, "rm", preset.rm_steps, preset.rm_lr, preset.rm_batch, len(pairs), seed + 1, loss_of, 100, log)
    return rm


def model_inputs(task, tokenizer, prompts: list[str]) -> list[str]:
    """The text a model reads for each of `prompts`: a chat task's user message rendered by the tokenizer's chat
    template with the generation prompt, as the trainers render a conversation (data.prompt_text); a text task's
    prompt as it is. The SFT demonstrations, the reward model's pairs and the measurements are all built on it, so the
    models learn exactly the token ids the trainers give them."""
    if not task.chat:
        return prompts
    return [prompt_text(conversation(p), tokenizer) for p in prompts]


def conversation(prompt: str) -> list[dict]:
    """A chat task's prompt as the dataset holds it: one user message."""
    return [{"role": "user", "content": prompt}]


def _write_assets(tmp: Path, tokenizer, sft, rm, train_prompts, test_prompts, meta: dict, task) -> None:
    """The prompts dataset holds a text task's prompts as text and a chat task's as conversations (one user message
    each, TRL's conversational format), with their answers."""
    from datasets import Dataset, DatasetDict

    assets = Assets(tmp)
    tokenizer.save_pretrained(assets.tokenizer)
    for path, model in ((assets.sft, sft), (assets.reward, rm)):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    as_prompt = conversation if task.chat else (lambda p: p)

    def split_columns(ps: list[str]) -> dict[str, list]:
        out = {"prompt": [as_prompt(p) for p in ps], "answer": [task.answer(p) for p in ps]}
        for p in ps if task.columns else ():  # the columns the task's rewards read (the code task's tests)
            for name, value in task.columns(p).items():
                out.setdefault(name, []).append(value)
        return out

    DatasetDict(
        {
            split: Dataset.from_dict(split_columns(ps))
            for split, ps in (("train", train_prompts), ("test", test_prompts))
        }
    ).save_to_disk(assets.prompts)
    assets.task_file.write_text(json.dumps(meta, indent=2) + "\n")


def build_preset(preset: str | BuildPreset, task: str) -> BuildPreset:
    """The preset `task` is built with: a named preset, with the task's TASK_BUDGETS for the default one; a custom
    BuildPreset as given."""
    if not isinstance(preset, str):
        return preset
    return replace(PRESETS[preset], **TASK_BUDGETS.get(task, {})) if preset == "default" else PRESETS[preset]


def build_tiny(
    out_dir: str | Path, seed: int = 0, preset: str | BuildPreset = "default", log=print, task: str = DEFAULT_TASK
) -> dict:
    """Build the built-in task's assets into `out_dir` (layout in the module docstring); returns task.json's dict.

    Deterministic from `seed` on a given machine and torch build. Written into a temporary sibling dir first and
    renamed into place, so readers never see a half-written build.
    """
    preset_name = preset if isinstance(preset, str) else "custom"
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    if task == "agent":  # conversations with a tool: its own tokenizer, demonstrations and no reward model
        cfg = AGENT_PRESETS[preset] if isinstance(preset, str) else preset
        with torch_threads(cfg.num_threads):
            return build_agent(Path(out_dir), seed, cfg, preset_name, BUILDER_VERSION, log)
    cfg = build_preset(preset, task)
    with torch_threads(cfg.num_threads):
        return _build(Path(out_dir), seed, cfg, preset_name, log, task)


def _build(out_dir: Path, seed: int, cfg: BuildPreset, preset_name: str, log, task: str) -> dict:
    t0 = time.perf_counter()
    spec = TASKS[task]
    out_dir = Path(out_dir).expanduser().absolute()
    ensure_replaceable(out_dir)  # fail before spending the build time
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    rng = random.Random(seed)
    tokenizer = build_chat_tokenizer() if spec.chat else build_tokenizer()

    # 1. prompts: train and test disjoint; `saved` as the prompts dataset holds them, the rest as the models read them
    saved = spec.make_prompts(cfg.n_train_prompts, rng)
    saved_test = spec.make_prompts(cfg.n_test_prompts, rng, exclude=set(saved))
    train_prompts, test_prompts = model_inputs(spec, tokenizer, saved), model_inputs(spec, tokenizer, saved_test)
    train_examples = [(p, spec.answer(p)) for p in train_prompts]
    log(f"[build-tiny] task {spec.name}, preset {preset_name}, seed {seed}: {len(train_prompts)} train prompts")

    # 2. supervised warm start
    sft = train_sft(tokenizer, train_examples, cfg, seed, log)
    t_sft = time.perf_counter() - t0

    # 3. reward-model pairs: synthetic near misses + wrong completions sampled from the SFT model
    pairs = _synthetic_pairs(spec, tokenizer, train_prompts, cfg.rm_synthetic_pairs, rng)
    sample_prompts = train_prompts[: cfg.rm_sample_prompts]
    for i, temp in enumerate(cfg.rm_sample_temperatures):
        comps = generate_completions(
            sft, tokenizer, sample_prompts, spec.max_new_tokens, temp, cfg.rm_samples_per_prompt, 256, seed + 10 + i
        )
        pairs += _policy_pairs(spec, tokenizer, sample_prompts, comps, cfg.rm_samples_per_prompt)
    log(f"  {len(pairs)} preference pairs ({len(pairs) - cfg.rm_synthetic_pairs} from SFT samples)")
    rm = train_reward_model(sft, tokenizer, pairs, cfg, seed, log)
    t_rm = time.perf_counter() - t0 - t_sft

    # 4. measurements on held-out test prompts
    eval_prompts = test_prompts[: cfg.eval_prompts]
    greedy_success = evaluate_success(sft, tokenizer, eval_prompts, spec.check, spec.max_new_tokens, None, 256, seed)
    n = cfg.best_of
    sampled = generate_completions(
        sft, tokenizer, eval_prompts, spec.max_new_tokens, cfg.temperature, n, 256, seed + 1
    )
    correct = np.array(
        [
            sampled.terminated[k] and spec.check(eval_prompts[k // n], sampled.texts[k])
            for k in range(len(sampled.texts))
        ]
    ).reshape(-1, n)
    seqs = [
        encode_completion(tokenizer, eval_prompts[k // n], sampled.texts[k], sampled.terminated[k])
        for k in range(len(sampled.texts))
    ]
    scores = score_sequences(rm, seqs, tokenizer.pad_token_id).view(-1, n)
    best_of_n = float(correct[np.arange(len(eval_prompts)), scores.argmax(1).numpy()].mean())
    test_synth = _synthetic_pairs(spec, tokenizer, eval_prompts, 4 * len(eval_prompts), random.Random(seed + 99))
    acc_synth = pair_accuracy(rm, test_synth, tokenizer.pad_token_id)
    acc_policy = pair_accuracy(rm, _policy_pairs(spec, tokenizer, eval_prompts, sampled, n), tokenizer.pad_token_id)
    wrong_scores = scores.numpy()[~correct]
    right_scores = scores.numpy()[correct]

    meta = {
        "name": spec.name,
        "check": spec.refs["check"],
        "reward_funcs": {k: v for k, v in spec.refs.items() if k != "check"},
        "seed": seed,
        "preset": preset_name,
        "builder_version": BUILDER_VERSION,
        "max_new_tokens": spec.max_new_tokens,
        "sft": {
            "greedy_success": greedy_success,
            "sampled_success": float(correct.mean()),
            "temperature": cfg.temperature,
            "eval_prompts": len(eval_prompts),
        },
        "reward": {
            "pair_accuracy_synthetic": acc_synth,
            "pair_accuracy_policy": acc_policy,
            f"best_of_{n}_success": best_of_n,
            "sampled_success": float(correct.mean()),  # the plain-sampling baseline best-of-n is compared with
            "score_mean_correct": float(right_scores.mean()) if right_scores.size else None,
            "score_mean_incorrect": float(wrong_scores.mean()) if wrong_scores.size else None,
            "score_std_incorrect": float(wrong_scores.std()) if wrong_scores.size else None,
            "loss": f"bradley_terry + {cfg.rm_calib_coef} * calibration(margin={cfg.rm_margin})",
            "train_pairs": len(pairs),
        },
        "config": asdict(cfg),
        "seconds": {"sft": round(t_sft, 2), "reward": round(t_rm, 2)},
    }
    meta["build_seconds"] = round(time.perf_counter() - t0, 2)
    log(
        f"[build-tiny] SFT success greedy {greedy_success:.3f}, sampled@{cfg.temperature} {correct.mean():.3f}; "
        f"RM pair acc synthetic {acc_synth:.3f}, policy {acc_policy:.3f}; best-of-{n} {best_of_n:.3f}; "
        f"{meta['build_seconds']:.1f}s"
    )

    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with progress_bars_hidden():
            _write_assets(tmp, tokenizer, sft, rm, saved, saved_test, meta, spec)
        install(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**meta, "out_dir": str(out_dir)}


def cache_root() -> Path:
    """$RLHFKIT_CACHE, else ~/.cache/rlhfkit."""
    return Path(os.environ.get("RLHFKIT_CACHE") or Path.home() / ".cache" / "rlhfkit").expanduser()


def builtin_assets(preset: str = "default", seed: int = 0, log=print, task: str = DEFAULT_TASK) -> Path:
    """Path of the cached built-in assets, building them on first use.

    Cache dir: cache_root() / f"{task}-{preset}-seed{seed}-v{BUILDER_VERSION}". Concurrent callers (e.g. several
    accelerate processes) serialise on a lock file beside it (filelock: the operating system's lock, which a killed
    builder does not keep); the first builds, the others find task.json and reuse it.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    target = cache_root() / f"{task}-{preset}-seed{seed}-v{BUILDER_VERSION}"
    if Assets(target).is_built():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + ".lock")):
        if not Assets(target).is_built():
            log(f"[rlhfkit] building the built-in task assets into {target} (first use; cached afterwards)")
            build_tiny(target, seed=seed, preset=preset, log=log, task=task)
    return target
