"""PPOTrainer(tools=[...]) (trainers/ppo/trainer.py, episodes.py): multi-turn PPO episodes on a tiny chat model that calls
tools. The policy and the value model read the tools' results but nothing trains on them: no gradient of the policy or
the value loss reaches the positions that predict them, whatever their text; they get no KL, no score, and GAE skips
them; the lengths count the policy's tokens; an episode's log-probs are its text's scored in one float64 forward; the
reward functions get each episode's messages."""

import os

import pytest
import torch
from datasets import Dataset

from rlhfkit import ops
from rlhfkit.config import PPOConfig
from rlhfkit.errors import ConfigError
from rlhfkit.metrics import registry
from rlhfkit.models import completion_token_stats
from rlhfkit.sampling import completions as sampling_completions
from rlhfkit.sampling.decoders import Generated
from rlhfkit.trainers.ppo import PPOTrainer
from tests.helpers import expand_templates
from tests.tool_chat import (
    END,
    async_add,
    call_text,
    multiply,
    read_jsonl,
    scripted_generate,
    tool_chat_model,
    tool_chat_tokenizer,
)


def config(tmp_path, **overrides) -> PPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"),
        report_to=["none"],
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        total_episodes=8,  # 2 updates of 4 episodes (each test sets its own)
        local_rollout_forward_batch_size=4,
        response_length=32,
        num_sample_generations=0,
        save_steps=0,
        logging_steps=1,
        seed=3,
    )
    values.update(overrides)
    return PPOConfig(**values)


def conversations(*contents: str) -> Dataset:
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": c}], "answer": str(i)} for i, c in enumerate(contents)]
    )


def accuracy(completions, answer, **kwargs):  # TRL's agent example's reward: the answer in the last message
    return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]


def test_ppo_with_tools_trains_end_to_end_and_logs_the_tool_metrics(tmp_path):
    # The real sampler on a random model, whatever it samples: every PPO and tools/* metric is logged.
    tok = tool_chat_tokenizer()
    args = config(tmp_path, max_tool_calling_iterations=2, total_episodes=4)  # one update
    trainer = PPOTrainer(
        args,
        tok,
        tool_chat_model(tok),
        train_dataset=conversations("What is 3 times 4?", "Add 1 and 2.", "3 * 5?", "2 + 2?"),
        reward_funcs=accuracy,
        tools=[multiply, async_add],
    )
    assert trainer.tools == [multiply, async_add]
    assert "Tools: multiply(a,b) async_add(a,b)" in tok.decode(trainer.train_dataset[0]["input_ids"])
    before = {k: v.detach().clone() for k, v in trainer.unwrapped.named_parameters()}
    assert trainer.train().global_step == 1
    after = dict(trainer.unwrapped.named_parameters())
    assert all(not torch.equal(before[k], after[k]) for k in ("policy.lm_head.weight", "value_model.score.weight"))
    rows = read_jsonl(os.path.join(args.output_dir, "metrics.jsonl"))
    (update,) = [r for r in rows if "episode" in r]
    assert update["tools/call_frequency"] >= 0 and update["tools/mean_turns"] >= 1
    logged = set().union(*(r.keys() for r in rows)) - {"step"}
    expected = expand_templates(registry.metrics_for("ppo"), ["accuracy"], tool_names=["multiply", "async_add"])
    not_this_run = {"eval/scores", "eval/task_success", "rollout/task_success"}  # no evaluation, no task
    not_this_run |= {m.name for m in expected if m.name.startswith("eval/tools/")}
    assert logged == {m.name for m in expected} - not_this_run


# ----------------------------------------------------------------------------------------------------------------
# Scripted episodes: each prompt names what its first turn does; after a tool result the model answers, except in
# "loop" episodes, which call multiply every turn until the turn cap.
FIRST_TURNS = {
    "ok": call_text("multiply", {"a": 3, "b": 4}),
    "async": "Adding." + call_text("async_add", {"a": 1, "b": 2}),
    "plain": f"No tool.{END}",
    "unknown": call_text("__import__", {"name": "os"}),
    "loop": call_text("multiply", {"a": 2, "b": 2}),
}


def script(text: str) -> str:
    prompt = text.split("<|im_start|>user\n", 1)[1].split(END, 1)[0]
    if "<tool_response>" not in text or prompt == "loop":
        return FIRST_TURNS[prompt]
    return f"Done.{END}"


def scripted_sampler(tok):
    """The scripted turns, with the log-probs the policy gives them (a forward, as the sampler's would be): PPO
    reuses the sampler's log-probs as logp_old where they are exact (float32). Greedy (evaluation): none."""
    scripted = scripted_generate(tok, script)

    def generate(model, prompt_ids, prompt_mask, config, **kwargs):
        tokens = scripted(model, prompt_ids, prompt_mask, config).tokens
        if not config.do_sample:
            return Generated(tokens, None)
        ids, mask = torch.cat([prompt_ids, tokens], 1), torch.cat([prompt_mask, torch.ones_like(tokens).bool()], 1)
        stats = completion_token_stats(model, ids, mask, prompt_ids.shape[1], tokens, config.temperature)
        return Generated(tokens, stats.logprobs.float())

    return generate


@pytest.fixture
def scripted(monkeypatch):
    tok = tool_chat_tokenizer()
    monkeypatch.setattr(sampling_completions, "generate", scripted_sampler(tok))
    return tok


def alternating(completions, **kwargs):  # scores that differ, so that every advantage is non-zero
    return [float(i % 2) for i in range(len(completions))]


def scripted_trainer(tok, tmp_path, reward=alternating, dtype=torch.float32, multiply_result=None, **overrides):
    """A PPO trainer on one batch of the scripted episodes (one update); multiply returns `multiply_result` (text)
    when given."""

    def multiply_as_text(a: int, b: int) -> str:
        """Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return multiply_result

    n = len(FIRST_TURNS)
    values = dict(
        per_device_train_batch_size=n, local_rollout_forward_batch_size=n, total_episodes=n, response_length=320
    )
    args = config(tmp_path, max_tool_calling_iterations=2, **{**values, **overrides})
    multiply_tool = multiply if multiply_result is None else multiply_as_text
    multiply_tool.__name__ = "multiply"
    return PPOTrainer(
        args,
        tok,
        tool_chat_model(tok, dtype=dtype),
        train_dataset=conversations(*FIRST_TURNS),
        reward_funcs=reward,
        tools=[multiply_tool, async_add],
    )


def row_of(batch, prompt: str) -> int:
    return batch.prompts.index([{"role": "user", "content": prompt}])


def test_reward_functions_get_the_messages_and_lengths_count_the_policy_s_tokens(scripted, tmp_path):
    seen = {}

    def recorded(prompts, completions, **kwargs):
        seen.update({p[0]["content"]: c for p, c in zip(prompts, completions)})
        return [0.0] * len(completions)

    trainer = scripted_trainer(scripted, tmp_path, recorded)
    batch = trainer.generation.generate_and_score([trainer.train_dataset[i] for i in range(len(FIRST_TURNS))])
    assert seen["ok"][0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert seen["ok"][1:] == [
        {"role": "tool", "name": "multiply", "content": "12"},
        {"role": "assistant", "content": "Done."},
    ]
    assert seen["async"][1]["content"] == "3" and seen["plain"] == [{"role": "assistant", "content": "No tool."}]
    assert seen["unknown"][1]["content"] == "{'error': 'Tool __import__ not found.'}"
    assert [m["role"] for m in seen["loop"]] == ["assistant", "tool"] * 2 + ["assistant"]  # the turn cap

    tool_tokens = batch.completion_mask & ~batch.model_mask
    ok, plain = row_of(batch, "ok"), row_of(batch, "plain")
    assert not tool_tokens[plain].any() and tool_tokens.any(1).sum() == len(FIRST_TURNS) - 1
    turns = len(scripted(FIRST_TURNS["ok"] + f"Done.{END}", add_special_tokens=False)["input_ids"])
    assert batch.model_mask[ok].sum() == turns  # both turns, nothing of the tool result
    tool_text = scripted.decode(batch.completion_ids[ok][tool_tokens[ok]])
    assert tool_text.startswith("<|im_start|>user\n<tool_response>12</tool_response>")
    # The episode as the policy read it, special tokens kept (the task checker's text, as GRPO's)
    assert batch.completions[ok] == FIRST_TURNS["ok"] + tool_text + f"Done.{END}"
    # The sampler's, old and reference log-probs and the values are 0 on the tools' results.
    for name in ("sampling_logprobs", "old_logprobs", "ref_logprobs", "values"):
        assert not getattr(batch, name)[tool_tokens].any(), name

    rewards = trainer.shaped_rewards(batch)
    gae = trainer.advantages(batch, rewards)
    m = trainer.run.metrics.reduce().scalars
    episodes = len(FIRST_TURNS)
    assert m["tokens/responses_len_mean"] == pytest.approx(batch.model_mask.sum().item() / episodes)
    assert m["tools/mean_tool_tokens"] == pytest.approx(tool_tokens.sum().item() / episodes)
    # ok, async, unknown: one call each; loop: two run, the third left pending by the turn cap
    assert m["tools/call_frequency"] == pytest.approx((1 + 1 + 1 + 2) / episodes)
    assert m["tools/failure_frequency"] == pytest.approx(1 / 5) and m["tools/turn_cap_ratio"] == 1 / episodes
    assert m["tools/multiply/calls"] == pytest.approx(3 / episodes)
    # objective/kl: the sequences' KL summed over the policy's tokens only
    kl = (batch.old_logprobs - batch.ref_logprobs).double() * batch.model_mask
    assert m["objective/kl"] == pytest.approx(kl.sum().item() / episodes, abs=1e-6)
    assert not gae.advantages[tool_tokens].any() and not gae.returns[tool_tokens].any()


def test_score_kl_and_gae_are_on_the_policy_s_tokens_only(scripted, tmp_path):
    trainer = scripted_trainer(scripted, tmp_path, kl_coef=0.5)
    batch = trainer.generation.generate_and_score([trainer.train_dataset[i] for i in range(len(FIRST_TURNS))])
    rewards = trainer.shaped_rewards(batch)
    tool_tokens = batch.completion_mask & ~batch.model_mask
    assert not rewards.kl[tool_tokens].any() and not rewards.rewards[tool_tokens].any()
    last_model = ops.last_true_index(batch.model_mask)
    rows = torch.arange(len(last_model))
    # The score sits on each episode's last policy token (an episode that ends with a tool result: before it).
    expected = batch.scores - 0.5 * rewards.kl[rows, last_model]
    torch.testing.assert_close(rewards.rewards[rows, last_model], expected)
    # The trainer's advantages are GAE on each episode's policy tokens compacted into one sequence, whitened over
    # the policy's tokens of the batch (mean 0, variance 1 there; 0 on the tools' results).
    gamma, lam = trainer.args.gamma, trainer.args.lam
    compact = torch.cat(
        [
            ops.gae(rewards.rewards[r][s][None], batch.values[r][s][None], s[s][None], gamma, lam).advantages[0]
            for r, s in enumerate(batch.model_mask)
        ]
    ).double()
    whitened = (compact - compact.mean()) / (compact.var() + 1e-8).sqrt()
    gae = trainer.advantages(batch, rewards)
    torch.testing.assert_close(gae.advantages[batch.model_mask].double(), whitened, rtol=1e-5, atol=1e-5)
    assert not gae.advantages[tool_tokens].any()


def final_hidden_grads(trainer, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """d (policy loss + vf_coef x value loss) / d (final hidden state) of the policy and of the value model at every
    position, from one real micro-step: at the last layer's output a position feeds only the logits of the token
    after it (policy) and the value of the state it ends (value model)."""
    captured = {}

    def keep(name):
        def hook(module, inputs, output):
            output.retain_grad()
            captured[name] = output

        return hook

    policy, value_model = trainer.unwrapped.policy, trainer.unwrapped.value_model
    handles = [
        policy.model.norm.register_forward_hook(keep("policy")),
        value_model.model.norm.register_forward_hook(keep("value")),
    ]
    try:
        gae = trainer.advantages(batch, trainer.shaped_rewards(batch))
        trainer.micro_step(batch, gae, torch.arange(len(batch.input_ids)), fresh=True)
    finally:
        for handle in handles:
            handle.remove()
    return captured["policy"].grad, captured["value"].grad


@pytest.mark.parametrize("result", ["12", "99"])  # the same length, another text
def test_tool_results_get_no_gradient_of_either_loss_whatever_their_text(scripted, tmp_path, result):
    trainer = scripted_trainer(scripted, tmp_path, dtype=torch.float64, multiply_result=result)
    with torch.no_grad():  # the value model's fresh score head is 0, which would pass no gradient to any position
        trainer.unwrapped.value_model.score.weight.normal_(generator=torch.Generator().manual_seed(0))
    batch = trainer.generation.generate_and_score([trainer.train_dataset[i] for i in range(len(FIRST_TURNS))])
    ok = row_of(batch, "ok")
    assert f"<tool_response>{result}</tool_response>" in batch.completions[ok]
    policy_grad, value_grad = final_hidden_grads(trainer, batch)
    width = batch.prompt_ids.shape[1]
    tool_tokens = batch.completion_mask & ~batch.model_mask
    assert tool_tokens.any()
    # position width + t - 1 predicts completion token t (policy) and holds the value of the state before it
    for grad in (policy_grad, value_grad):
        at = grad[:, width - 1 : -1].abs().sum(-1)
        assert (at[batch.model_mask] > 0).sum() > batch.model_mask.sum() // 2  # not vacuous: the turns do train
        assert torch.all(at[tool_tokens] == 0)  # exactly no gradient through the tool results


def test_an_episode_s_log_probs_are_its_text_s_scored_in_one_forward(scripted, tmp_path):
    trainer = scripted_trainer(scripted, tmp_path, dtype=torch.float64)
    batch = trainer.generation.generate_and_score([trainer.train_dataset[i] for i in range(len(FIRST_TURNS))])
    model, width = trainer.unwrapped.policy, batch.prompt_ids.shape[1]
    temperature = trainer.args.temperature
    for r in range(len(batch.input_ids)):
        ids = batch.input_ids[r][batch.attention_mask[r]].tolist()
        again = scripted(scripted.decode(ids, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
        assert again == ids  # the episode is its text: nothing was re-tokenized differently
        prompt_len = int(batch.prompt_mask[r].sum())
        with torch.no_grad():
            logits = model(torch.tensor([again])).logits[0].double() / temperature
        reference = torch.log_softmax(logits, -1)[prompt_len - 1 : -1].gather(
            -1, torch.tensor(again[prompt_len:])[:, None]
        )[:, 0]
        n = len(again) - prompt_len
        mask = batch.model_mask[r, :n]
        assert mask.any() and (~mask).any() == (r != row_of(batch, "plain"))
        torch.testing.assert_close(batch.old_logprobs[r, :n][mask], reference[mask], rtol=0, atol=1e-10)
    assert batch.old_logprobs.shape[1] == batch.completion_ids.shape[1] and width == batch.prompt_ids.shape[1]


def test_evaluation_runs_the_tools_and_shows_the_episodes(scripted, tmp_path):
    seen = []

    def recorded(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    trainer = scripted_trainer(scripted, tmp_path, recorded)
    metrics = trainer.evaluate(conversations("ok", "unknown"))
    assert metrics["eval_scores"] == 1.0
    ok, unknown = seen  # greedy: one episode per prompt
    assert [m["role"] for m in ok] == ["assistant", "tool", "assistant"] and ok[1]["content"] == "12"
    assert unknown[1]["content"] == "{'error': 'Tool __import__ not found.'}"
    assert metrics["eval_tools/call_frequency"] == 1.0 and metrics["eval_tools/failure_frequency"] == 0.5
    assert metrics["eval_tools/multiply/failure_frequency"] == 0.0 and metrics["eval_tools/max_turns"] == 2.0


def test_tools_need_conversational_prompts(tmp_path):
    tok = tool_chat_tokenizer()
    with pytest.raises(ConfigError, match=r"PPOTrainer\(tools=\.\.\.\) needs conversational prompts.*'prompt' column"):
        PPOTrainer(
            config(tmp_path),
            tok,
            tool_chat_model(tok),
            train_dataset=Dataset.from_list([{"prompt": "3 times 4?"}]),
            reward_funcs=len,
            tools=[multiply],
        )


def test_max_tool_calling_iterations_is_a_count_or_unset():
    assert PPOConfig(report_to=["none"]).max_tool_calling_iterations is None
    assert PPOConfig(max_tool_calling_iterations=3, report_to=["none"]).max_tool_calling_iterations == 3
    with pytest.raises(ConfigError, match="max_tool_calling_iterations=-1"):
        PPOConfig(max_tool_calling_iterations=-1, report_to=["none"])
