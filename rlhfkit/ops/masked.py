"""Statistics over the positions a boolean mask selects (True = counts).

Values outside the mask are never read: they are replaced with 0 through `torch.where` (not multiplied by the
mask), so padding that holds inf or NaN cannot leak into a result as `inf * 0 = NaN`.
"""

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` over positions where `mask` is True.

    x: (B, T) float (any shape works). mask: bool, same shape as x, True = include.
    Returns () when dim is None, else x reduced along `dim` (e.g. (B,) for dim=-1).
    """
    selected = torch.where(mask, x, 0.0)
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is True.

    x: (B, T) float. mask: (B, T) bool, True = include. Returns () when dim is None, else reduced along `dim`.
    An empty mask (or an empty row with dim set) gives 0, not NaN, so a process or micro-batch with no completion
    tokens contributes nothing instead of poisoning the average.
    """
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def _masked_moments(x: Tensor, mask: Tensor, unbiased: bool) -> tuple[Tensor, Tensor]:
    """(mean, var) over the masked elements, both ()."""
    count = mask.sum()
    # The mean is refined with one correction pass (mean of the residuals). Then identical values give a mean
    # equal to them and a variance of exactly 0, instead of a rounding error of ~1 ulp that whitening's
    # 1 / sqrt(var + 1e-8) would magnify 1e4-fold.
    mean = masked_mean(x, mask)
    mean = mean + masked_mean(x - mean, mask)
    centred = torch.where(mask, x - mean, 0.0)
    denominator = count - 1 if unbiased else count
    # With 0 or 1 elements every centred value is 0, so clamping the denominator gives exactly 0 without a
    # data-dependent branch (no host-device sync on GPU).
    return mean, centred.square().sum() / denominator.clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over all positions where `mask` is True (one number for the whole tensor).

    x: (B, T) float. mask: (B, T) bool, True = include. Returns ().
    unbiased=True divides by n - 1 (Bessel), as TRL's `masked_var` and `torch.var` do; False divides by n.
    Fewer than 2 selected elements gives 0: one number has no spread, and 0 keeps whitening finite.
    Identical selected values give exactly 0.
    """
    return _masked_moments(x, mask, unbiased)[1]


def masked_whiten(x: Tensor, mask: Tensor, keep_mean: bool = False) -> Tensor:
    """Standardise `x` to unit variance over the masked positions; the output mean is 0, or the input's masked
    mean when `keep_mean=True` (lm-human-preferences' reward scaling, which keeps the reward level).

    x: (B, T) float. mask: (B, T) bool, True = include. Returns (B, T), 0 outside the mask.
    Uses the unbiased masked variance and divides by sqrt(var + 1e-8), as TRL's `masked_whiten`.
    """
    mean, var = _masked_moments(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if keep_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, 0.0)
