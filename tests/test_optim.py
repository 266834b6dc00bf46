"""The optimizer and the learning-rate schedules (rlhfkit/optim.py), against transformers' own."""

import pytest
import torch
from transformers import get_scheduler
from transformers.optimization import Adafactor

from rlhfkit.config import GRPOConfig, PPOConfig
from rlhfkit.optim import LR_SCHEDULER_TYPES, OPTIMIZERS, lr_schedule, make_optimizer, warmup_steps

SCHEDULE_KWARGS = {"cosine_with_min_lr": {"min_lr_rate": 0.1}, "cosine": {"num_cycles": 0.4}}


def stepped_by_transformers(kind, learning_rate, warmup, num_steps, kwargs):
    """The lr of each of `num_steps` optimizer steps when transformers' scheduler is stepped after each, as TRL does."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=learning_rate)
    scheduler = get_scheduler(kind, optimizer, warmup, num_steps, scheduler_specific_kwargs=kwargs)
    lrs = []
    for _ in range(num_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("kind", LR_SCHEDULER_TYPES)
@pytest.mark.parametrize("warmup", [0, 3])
def test_each_schedule_is_transformers_stepped_once_per_step(kind, warmup):
    args = PPOConfig(
        learning_rate=2e-4, lr_scheduler_type=kind, warmup_steps=warmup, lr_scheduler_kwargs=SCHEDULE_KWARGS.get(kind)
    )
    lr = lr_schedule(args, num_steps=12)
    expected = stepped_by_transformers(kind, 2e-4, warmup, 12, SCHEDULE_KWARGS.get(kind))
    assert [lr(s) for s in range(1, 13)] == pytest.approx(expected, rel=1e-12, abs=0)
    if warmup and kind != "constant":  # constant ignores the warm-up, as in transformers
        assert lr(1) == 0.0  # TRL's first warm-up step


def test_default_is_linear_decay_without_warmup():
    # lr of step s (1-based) of N: base * (N - s + 1) / N, so the last step still learns and the next would be 0.
    assert [lr_schedule(GRPOConfig(learning_rate=1.0), 4)(s) for s in range(1, 5)] == [1.0, 0.75, 0.5, 0.25]


def test_warmup_then_linear_decay():
    lr = lr_schedule(GRPOConfig(learning_rate=1.0, warmup_steps=2), 5)
    assert [lr(s) for s in range(1, 6)] == pytest.approx([0.0, 0.5, 1.0, 2 / 3, 1 / 3])


def test_warmup_share_as_in_transformers_5():
    assert warmup_steps(GRPOConfig(warmup_steps=0.25), 10) == 3  # ceil(2.5)
    assert warmup_steps(GRPOConfig(warmup_steps=0.25, warmup_ratio=0.5), 10) == 3  # warmup_steps wins


def test_cosine_with_min_lr_ends_at_the_floor():
    args = PPOConfig(learning_rate=1.0, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs='{"min_lr": 0.2}')
    assert args.lr_scheduler_kwargs == {"min_lr": 0.2}  # JSON from the command line
    lr = lr_schedule(args, 100)
    assert lr(1) == 1.0 and lr(100) == pytest.approx(0.2, abs=1e-3)


def parameters():
    return [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]


@pytest.mark.parametrize("optim", OPTIMIZERS)
def test_each_optimizer_is_built_with_its_hyper_parameters(optim):
    args = GRPOConfig(optim=optim, learning_rate=1e-3, weight_decay=0.01, adam_epsilon=1e-6, adam_beta2=0.95)
    optimizer = make_optimizer(parameters(), args, torch.device("cpu"))
    group = optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["weight_decay"] == 0.01
    if optim.startswith("adamw"):
        assert type(optimizer) is torch.optim.AdamW
        assert group["eps"] == 1e-6 and group["betas"] == (0.9, 0.95)
        assert group["fused"] is (optim == "adamw_torch_fused")  # CPU has a fused kernel
    elif optim == "sgd":
        assert type(optimizer) is torch.optim.SGD and group["momentum"] == 0
    else:
        assert type(optimizer) is Adafactor
        assert (group["scale_parameter"], group["relative_step"], group["warmup_init"]) == (False, False, False)


def test_adafactor_follows_the_lr_it_is_given():
    """With relative_step=False the run's lr (set on the group every step) is the step size Adafactor uses."""
    params = parameters()
    optimizer = make_optimizer(params, GRPOConfig(optim="adafactor", learning_rate=1e-2), torch.device("cpu"))
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    sum(p.sum() for p in params).backward()
    optimizer.step()
    assert all(torch.equal(p, torch.ones_like(p)) for p in params)


def test_unsupported_optimizers_and_schedules_name_the_supported_ones():
    with pytest.raises(ValueError, match=r"optim='adamw_bnb_8bit': not supported by rlhfkit .*adamw_torch, "):
        PPOConfig(optim="adamw_bnb_8bit")
    with pytest.raises(ValueError, match=r"lr_scheduler_type='polynomial': not supported by rlhfkit"):
        PPOConfig(lr_scheduler_type="polynomial")
    with pytest.raises(ValueError, match=r"save_strategy='best': not supported by rlhfkit \(it needs --metric_for"):
        PPOConfig(save_strategy="best")
    with pytest.raises(ValueError, match=r"cosine_with_min_lr.*One of min_lr or min_lr_rate"):
        PPOConfig(lr_scheduler_type="cosine_with_min_lr")
    with pytest.raises(ValueError, match=r"unexpected keyword argument 'min_lr_rate'.*leave --lr_scheduler_kwargs"):
        PPOConfig(lr_scheduler_kwargs={"min_lr_rate": 0.1})


def test_warmup_steps_from_ratio_or_count():
    assert warmup_steps(GRPOConfig(warmup_ratio=0.1), 100) == 10
    assert warmup_steps(GRPOConfig(warmup_ratio=0.1, warmup_steps=3), 100) == 3
    assert warmup_steps(GRPOConfig(warmup_ratio=0.5), 1) == 0  # a one-step run has no room to warm up
