"""The metric registry: names verbatim from the reference docs, complete declarations, fresh docs."""

import ast
import re
import sys
from pathlib import Path

import pytest

from rlhfkit.metrics import registry
from rlhfkit.metrics.docs import render_markdown
from rlhfkit.metrics.registry import ALIASES, REGISTRY, Metric, metrics_for, older_names
from tests.helpers import expand_templates

ROOT = Path(__file__).resolve().parents[2]
# The reference seeds live beside the repository (CI clones it with ../shared next to it).
SEEDS = ROOT.parent / "shared" / "seeds"
needs_seeds = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"reference seeds not found at {SEEDS}")

# PPO metric names of the reference docs (seeds 002, 003, 004: TRL's PPO logging pages), verbatim.
SEED_PPO_NAMES = [
    "eps",
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "policy/entropy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "lr",
    "episode",
    "objective/kl_coef",
]

# Names of TRL's original PPOTrainer (seed 000). Each must be an older name (alias) of a registry metric, so that
# --log_legacy_names sends it.
SEED_000_NAMES = [
    "env/reward_mean",
    "env/reward_std",
    "env/reward_dist",
    "objective/kl",
    "objective/kl_dist",
    "objective/kl_coef",
    "ppo/mean_non_score_reward",
    "objective/entropy",
    "ppo/learning_rate",
    "ppo/policy/entropy",
    "ppo/policy/clipfrac",
    "ppo/policy/approxkl",
    "ppo/policy/policykl",
    "ppo/policy/ratio",
    "ppo/policy/advantages_mean",
    "ppo/policy/advantages",
    "ppo/returns/mean",
    "ppo/returns/var",
    "ppo/val/mean",
    "ppo/val/var",
    "ppo/val/var_explained",
    "ppo/val/clipfrac",
    "ppo/val/vpred",
    "ppo/val/error",
    "ppo/loss/policy",
    "ppo/loss/value",
    "ppo/loss/total",
    "tokens/queries_len_mean",
    "tokens/queries_len_std",
    "tokens/queries_dist",
    "tokens/responses_len_mean",
    "tokens/responses_len_std",
    "tokens/responses_dist",
    "objective/logprobs",
    "objective/ref_logprobs",
    "ppo/mean_scores",
    "ppo/std_scores",
]


def test_every_seed_ppo_name_is_registered_verbatim_for_ppo():
    ppo_names = {m.name for m in metrics_for("ppo", kind=None)}
    missing = [name for name in SEED_PPO_NAMES if name not in ppo_names]
    assert not missing, f"seed PPO metrics missing from the registry: {missing}"


@needs_seeds
def test_seed_files_list_no_ppo_name_we_miss():
    # Seed 002 (markdown): "1. `name`: ..." lines; seed 004: "- name: ..." lines of its PPO section.
    text_002 = next(SEEDS.glob("002_*.txt")).read_text()
    names = set(re.findall(r"^1\. `([a-z_/]+)`", text_002, flags=re.M))
    text_004 = next(SEEDS.glob("004_*.txt")).read_text()
    ppo_004 = text_004.split("PPO Logging", 1)[1].split("GRPO Logging", 1)[0]
    names |= set(re.findall(r"^- ([a-z_]+(?:/[a-z_]+)*):", ppo_004, flags=re.M))
    assert len(names) >= len(SEED_PPO_NAMES) - 1  # the parse found the lists
    assert names <= {m.name for m in metrics_for("ppo", kind=None)}


# GRPO metric names of seed 004 ("GRPO Logging"), verbatim; the seed's Liger-only `clip_ratio` is not logged
# (rlhfkit has no fused loss), and rlhfkit adds frac_reward_zero_std, eps, episode, lr and loss.
SEED_GRPO_NAMES = [
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "rewards/{reward_func_name}/mean",
    "rewards/{reward_func_name}/std",
    "reward",
    "reward_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_mean",
    "clip_ratio/high_max",
    "clip_ratio/region_mean",
    "frac_reward_zero_std",
    "eps",
    "episode",
    "lr",
    "loss",
]


def test_every_seed_grpo_name_is_registered_verbatim_for_grpo():
    grpo_names = {m.name for m in metrics_for("grpo", kind=None)}
    assert [name for name in SEED_GRPO_NAMES if name not in grpo_names] == []


@needs_seeds
def test_seed_004_lists_no_grpo_name_we_miss():
    grpo_004 = next(SEEDS.glob("004_*.txt")).read_text().split("GRPO Logging", 1)[1].split("Crucial GRPO", 1)[0]
    names = set(re.findall(r"- ([a-z_]+(?:/[a-z_{}]+)*):", grpo_004))  # some items share a line in the seed
    assert len(names) >= 19  # the parse found the list
    assert names - {"clip_ratio"} <= {m.name for m in metrics_for("grpo", kind=None)}


def test_templates_expand_per_reward_function():
    mean = registry.expand(registry.REWARDS_FUNC_MEAN, "correctness")
    assert (mean.name, mean.reduction) == ("rewards/correctness/mean", "mean")
    names = [m.name for m in expand_templates(metrics_for("grpo"), ["a", "b"])]
    assert "rewards/a/mean" in names and "rewards/b/std" in names
    assert not any("{" in n for n in names)
    with pytest.raises(ValueError):
        registry.expand(registry.REWARD, "a")


@needs_seeds
def test_seed_files_000_001_list_no_older_name_we_miss():
    """Every metric name on the older trainer's pages is an older name of a registered metric (so that
    --log_legacy_names sends it). Seed 000 also mentions `tokens/responses_len_dist`, but only as the name the
    distribution "should" have had; the trainer logged `tokens/responses_dist`."""
    text = "".join(next(SEEDS.glob(f"{n}_*.txt")).read_text() for n in ("000", "001"))
    names = set(re.findall(r"(?<![\w/])((?:env|ppo|objective|tokens)/[a-z_/]+[a-z])", text))
    assert len(names) >= len(SEED_000_NAMES)  # the parse found the lists
    assert names - {"tokens/responses_len_dist"} <= set(ALIASES)


def test_older_trl_names_are_older_names_of_registered_metrics():
    assert [n for n in SEED_000_NAMES if n not in ALIASES] == []
    assert all("ppo" in REGISTRY[ALIASES[n]].trainers for n in SEED_000_NAMES)


def test_names_and_aliases_are_unique():
    keys = [key for m in REGISTRY.values() for key in dict.fromkeys((m.name, *m.aliases))]
    assert len(keys) == len(set(keys))
    constants = [v for v in vars(registry).values() if isinstance(v, Metric)]
    assert len(constants) == len(REGISTRY)  # no constant shadowed by another with the same name


def test_every_metric_is_fully_declared():
    for m in REGISTRY.values():
        for field in ("meaning", "formula", "unit", "when"):
            assert getattr(m, field).strip(), f"{m.name}: empty {field}"
        assert "\n" not in m.meaning, m.name
        assert m.reduction in registry.REDUCTIONS, m.name
        assert (m.kind == "histogram") == (m.reduction == "histogram"), m.name
        assert m.trainers and m.trainers <= set(registry.TRAINERS), m.name


def test_metric_rejects_inconsistent_declarations():
    with pytest.raises(ValueError, match="histogram"):
        Metric("x/y", "m", "f", "u", "mean", kind="histogram")
    with pytest.raises(ValueError, match="reduction"):
        Metric("x/y", "m", "f", "u", "median")
    with pytest.raises(ValueError, match="formula"):
        Metric("x/y", "m", " ", "u", "mean")


def test_metrics_for_splits_scalars_and_histograms():
    scalars, hists = metrics_for("ppo"), metrics_for("ppo", "histogram")
    assert all(m.kind == "scalar" for m in scalars) and all(m.kind == "histogram" for m in hists)
    assert {m.name for m in hists} == {
        "env/reward_dist",
        "objective/kl_dist",
        "objective/logprobs",
        "objective/ref_logprobs",
        "policy/ratio_dist",
        "policy/advantages_dist",
        "tokens/queries_dist",
        "tokens/responses_dist",
    }
    assert set(metrics_for("ppo", None)) == set(scalars) | set(hists)
    assert metrics_for("grpo", "histogram") == []
    with pytest.raises(ValueError, match="ppo"):
        metrics_for("dpo")


def test_older_names_are_the_older_trainers_names_only():
    out = older_names({"objective/scores": 1.5, "lr": 0.1, "objective/kl": 2.0, "reward": 3.0, "custom": 4.0})
    assert out == {
        "env/reward_mean": 1.5,
        "ppo/mean_scores": 1.5,
        "ppo/learning_rate": 0.1,
        "objective/kl": 2.0,  # logged by the older trainer under the current name
    }


def test_docs_metrics_md_is_fresh():
    path = ROOT / "docs" / "metrics.md"
    assert path.read_text(encoding="utf-8") == render_markdown(), "docs/metrics.md is stale: run `make docs`"


def test_docs_mention_every_metric_and_crucial_values_first():
    text = render_markdown()
    for m in REGISTRY.values():
        assert f"`{m.name}`" in text, m.name
    ppo = text.split("## PPO", 1)[1]
    assert ppo.index("### Crucial values") < ppo.index("### Watch for stability") < ppo.index("### Scalars")


def test_make_docs_writes_the_markdown(tmp_path, monkeypatch):
    """`python docs/generate.py` (make docs) writes the renderer's text into the page."""
    from docs import generate as docs

    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    monkeypatch.setattr(docs, "PAGES", (docs.Page("docs/metrics.md", render_markdown),))
    assert docs.main([]) == 0
    assert (tmp_path / "docs" / "metrics.md").read_text(encoding="utf-8") == render_markdown()
    assert docs.main(["--check"]) == 0


def test_registry_imports_only_the_standard_library():
    tree = ast.parse(Path(registry.__file__).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"__future__"}
