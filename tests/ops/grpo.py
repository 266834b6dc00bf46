"""The GRPO loss as the tests call it: the GRPO paper's plain variant unless a test says otherwise."""

from rlhfkit import ops

# The plain variant (token ratios, no bias-corrected KL, no two-sided clip) and TRL 1.16's SAPO/VESPO shapes. The
# library's defaults are GRPOConfig's; ops.grpo_per_token_loss takes every setting as an argument.
PLAIN_GRPO = dict(
    loss_type="grpo",
    importance_sampling_level="token",
    delta=None,
    use_bias_correction_kl=False,
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    vespo_k_pos=2.0,
    vespo_lambda_pos=3.0,
    vespo_k_neg=3.0,
    vespo_lambda_neg=2.0,
)


def grpo_loss(
    logprobs, old_logprobs, advantages, mask, epsilon_low, epsilon_high, ref_logprobs=None, beta=0.0, **settings
):
    """ops.grpo_per_token_loss with PLAIN_GRPO's settings, `settings` replacing some of them."""
    return ops.grpo_per_token_loss(
        logprobs, old_logprobs, advantages, mask, epsilon_low, epsilon_high, ref_logprobs, beta,
        **{**PLAIN_GRPO, **settings},
    )  # fmt: skip
