"""Fixtures of the sampling tests: the built-in task's SFT model with four left-padded prompts, and fresh state of the
once-per-class notices."""

import weakref

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.sampling import decoders, fallback, left_pad


@pytest.fixture(scope="module")
def sft(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft", padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    prompts = [tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 999901=", "sort 12=", "sort 55555=")]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    return tokenizer, model, ids, mask


@pytest.fixture
def fresh_notices(monkeypatch):
    """Each test starts with no model class known to refuse the lean loop and no generation option announced (so
    their notices are said again)."""
    monkeypatch.setattr(fallback, "_NO_LEAN_LOOP", {})
    monkeypatch.setattr(fallback, "_ANNOUNCED_OPTIONS", set())
    monkeypatch.setattr(fallback, "_ANNOUNCED_GENERATE", set())


@pytest.fixture
def fresh_static(monkeypatch):
    """No model class refused the static cache yet, and no compiled step is kept from another test."""
    monkeypatch.setattr(decoders, "_NO_STATIC", {})
    monkeypatch.setattr(decoders, "_STATIC_STEPS", weakref.WeakKeyDictionary())
