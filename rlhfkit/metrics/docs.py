"""docs/metrics.md, generated from the metric registry (``make docs``)."""

from __future__ import annotations

from rlhfkit.metrics.registry import TRAINERS, Metric, metrics_for

_CONVENTIONS = """\
## Conventions

- **Step.** PPO: the tracker step is the update index (one rollout batch and its PPO epochs), starting at 1.
  GRPO: the optimizer step, starting at 1; a generated batch serves `num_iterations` steps. `eval/*`
  metrics and completion tables are logged at sample-generation steps, step 0 being the policy before
  training.
- **Logging window.** Training metrics are logged as one row every `logging_steps` steps and after the
  last step. A row covers every step since the previous row (its window), the same way for PPO and GRPO:
  the sums, counts and extremes of all the window's steps are pooled as each metric's reduction says
  (below) before dividing, so a row with `logging_steps 2` is exactly what pooling the two rows of
  `logging_steps 1` gives, not the last step alone; histograms hold the values of every step of the
  window; `nonfinite_steps` counts the skipped steps of the whole window; `last` metrics (`lr`,
  `episode`, `eps`, `objective/kl_coef`, `num_tokens`) are their values at the logged step. Per-step means
  such as `time/*` are averaged over the window's steps. PPO's adaptive KL controller still adapts after
  every update, with that update's own KL. A checkpoint taken mid-window carries the window's sums, so a
  resumed run logs the same rows.
- **Masking.** Per-token statistics count real response tokens only: the mask is True from the first
  response token up to and including the stop token, False on padding and on anything generated after
  the stop token. Padded positions never carry sentinel values and never enter a numerator or a
  denominator. A response without a stop token is masked up to the length limit.
- **Per sequence vs per token.** Names that sum over a response (`objective/kl`, `objective/entropy`,
  `objective/non_score_reward`, `objective/rlhf_reward`) are in units per sequence; `*_avg` statistics
  of the optimisation are per token.
- **Pooling.** A metric's reduction says how values from micro-batches, mini-batches, PPO epochs and
  processes combine:
  - `mean`: sum of values and count of items are added up everywhere first, then divided once
    (a token-weighted mean for per-token metrics, a response-weighted mean for per-sequence ones).
    Splitting a batch into micro-batches or across processes does not change the result.
  - `var` / `std`: count, sum and sum of squares are pooled the same way, then the unbiased variance
    `(sum x^2 - (sum x)^2 / n) / (n - 1)` is formed (0 when n < 2); `std` is its square root.
  - `sum`: summed over everything, including processes.
  - `min` / `max`: over everything.
  - `last`: the main process's value at the logged step (learning rate, episode and token counters).
  - `histogram`: the raw values of all processes and all steps of the window, gathered.
  An empty pool (no tokens) gives 0, not NaN.
- **Units.** Log-probabilities and KL are in nats. `reward` is the unit of the reward model's or
  reward function's score; `reward^2` for squared errors and variances of rewards, values and returns.
- **Names in the trackers.** The names in these tables are the ones `metrics.jsonl`, `rlhfkit report` and
  `rlhfkit doctor` use. The trackers (Trackio, W&B, TensorBoard and every other `--report_to`) get TRL's keys,
  as transformers' callbacks write them: training metrics under `train/<name>` (`train/objective/kl`,
  `train/episode`, `train/reward`), `eval/*` metrics under their own name, and `train/global_step` (the
  step) with every row; W&B uses `train/global_step` as the x-axis of every chart. So a TRL run and an
  rlhfkit run of the same metric share a chart and openrlbenchmark's `xaxis=train/episode` filters find
  both. Histograms follow the same rule; completion tables are logged under `completions`.
- **Older names.** The older trainer (TRL's original `PPOTrainer`, up to TRL 0.11) logged some quantities
  under other names (`env/reward_mean`, `ppo/mean_scores`, `ppo/policy/approxkl`, ...) and the rest under
  the names above, without the `train/` prefix. With `--log_legacy_names` every such metric is also sent to
  the trackers under its older name, unprefixed, so dashboards built for the old trainer keep working
  (`rlhfkit.metrics.registry.older_names`). The tables list the older names.
- **Notation.** `b` indexes responses and `t` response tokens; `m_bt` is the response mask; `logp_bt`
  and `ref_bt` are the sampled token's log-probabilities under the sampling policy and the frozen
  reference (at the sampling temperature); `kl_bt` is `logp - ref` (k1, default) or
  `exp(ref - logp) - 1 - (ref - logp)` (k3); `R_b` is the score after the EOS trick; `V_bt`, `G_bt`, `A_bt`
  are rollout values, GAE returns and GAE advantages; `r_bt = exp(logp_new - logp_old)` during
  optimisation; `V_new` is the value model's prediction during optimisation.
"""

_SECTION_TITLES = {
    "": "Run progress",
    "objective": "Objective (rollout, before the PPO epochs)",
    "policy": "Policy optimisation",
    "loss": "Losses",
    "val": "Value model and ratio",
    "returns": "Returns",
    "tokens": "Lengths",
    "rollout": "Task success",
    "eval": "Task success",
    "time": "Wall time",
    "env": "Rewards",
    "completions": "Completions",
    "rewards": "Rewards",
    "clip_ratio": "Policy optimisation",
    "health": "Health checks",
}


def _section(metric: Metric) -> str:
    if metric.section:
        return metric.section
    prefix = metric.name.split("/", 1)[0] if "/" in metric.name else ""
    return _SECTION_TITLES.get(prefix, prefix)


def _cell(text: str) -> str:
    """Make text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _name_cell(metric: Metric) -> str:
    cell = f"`{metric.name}`"
    renamed = [alias for alias in metric.aliases if alias != metric.name]
    if renamed:
        cell += "<br>was " + ", ".join(f"`{a}`" for a in renamed)
    return cell


def _table(metrics: list[Metric]) -> list[str]:
    lines = [
        "| Metric | Meaning | Formula | Unit | Reduction | Logged |",
        "|---|---|---|---|---|---|",
    ]
    for m in metrics:
        cells = [_name_cell(m), _cell(m.meaning), f"`{_cell(m.formula)}`", m.unit, f"`{m.reduction}`", _cell(m.when)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _trainer_section(trainer: str) -> list[str]:
    scalars = metrics_for(trainer, "scalar")
    histograms = metrics_for(trainer, "histogram")
    everything = scalars + histograms
    lines = [f"## {trainer.upper()}", ""]

    lines += ["### Crucial values", ""]
    for m in (m for m in everything if m.importance == "crucial"):
        lines.append(f"- `{m.name}`: {m.meaning} {m.watch}".rstrip())
    lines += ["", "### Watch for stability", ""]
    for m in (m for m in everything if m.importance == "stability"):
        lines.append(f"- `{m.name}`: {m.meaning} {m.watch}".rstrip())

    lines += ["", "### Scalars", ""]
    sections: dict[str, list[Metric]] = {}
    for m in scalars:
        sections.setdefault(_section(m), []).append(m)
    for title, members in sections.items():
        lines += [f"#### {title}", "", *_table(members), ""]

    if histograms:
        lines += ["### Histograms", "", *_table(histograms), ""]

    differing = [m for m in everything if m.vs_trl]
    if differing:
        lines += ["### Where rlhfkit deliberately differs from TRL", ""]
        lines += [f"- `{m.name}`: {m.vs_trl}" for m in differing]
        lines.append("")

    aliased = [m for m in everything if m.aliases]
    if aliased:
        lines += ["### Older names", "", "| Older name | Current name |", "|---|---|"]
        lines += [f"| `{alias}` | `{m.name}` |" for m in aliased for alias in m.aliases]
        lines.append("")
    return lines


def render_markdown() -> str:
    """The text of docs/metrics.md, generated from the registry."""
    lines = [
        "# Metrics",
        "",
        "<!-- Generated by `make docs` from rlhfkit/metrics/registry.py.",
        "     Do not edit by hand; tests/metrics/test_registry.py checks it. -->",
        "",
        "Every number rlhfkit sends to Trackio, Weights & Biases or TensorBoard (and writes to",
        "`metrics.jsonl` in the run directory) is listed here with its exact formula, unit and the way it",
        "is pooled across micro-batches and processes. Names follow TRL's documentation, so dashboards and",
        "comparisons built for TRL keep working; where the numbers differ from TRL's, the difference is",
        "listed and explained.",
        "",
        _CONVENTIONS,
    ]
    for trainer in TRAINERS:
        if metrics_for(trainer, None):
            lines += _trainer_section(trainer)
    return "\n".join(lines).rstrip("\n") + "\n"
