"""rlhfkit/models/loading.py: the float32 LM head of cast_lm_head_to_fp32, and why a model could not be loaded."""

import json

import pytest
import torch

from rlhfkit.errors import ConfigError
from rlhfkit.models import (
    cast_lm_head_to_fp32,
    completion_logits,
    frozen_copy,
)
from tests.models.common import bf16_model

# ---- cast_lm_head_to_fp32 ----


def logits_and_reference(model, ids, attention, width):
    """completion_logits of `model`, and the float64 product of the very hidden states the head got with its weight."""
    seen = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    logits = completion_logits(model, ids, attention, width)
    handle.remove()
    hidden = seen[0][:, :-1]  # the head ran on the T + 1 kept positions; the last predicts nothing here
    reference = hidden.double() @ model.lm_head.weight.double().T
    return logits, reference


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_cast_lm_head_to_fp32_computes_float32_logits(tiny_assets, batch, tied):
    _, ids, attention, width = batch
    model = bf16_model(tiny_assets, tied)
    plain, reference = logits_and_reference(model, ids, attention, width)
    assert plain.dtype == torch.bfloat16
    bf16_error = (plain.double() - reference).abs().max().item()

    assert cast_lm_head_to_fp32(model) is model
    assert model.lm_head.weight.dtype == torch.float32
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied  # a tied weight stays one weight
    for autocast in (False, True):  # also under mixed precision, which would compute the product in bf16
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, reference = logits_and_reference(model, ids, attention, width)
        assert logits.dtype == torch.float32
        # float32 rounding of a float64 product of the same inputs: a few ulps of the largest logit
        scale = reference.abs().max().item()
        torch.testing.assert_close(logits.double(), reference, atol=4 * scale * 2**-24, rtol=0)
    assert bf16_error > 100 * scale * 2**-24  # what the cast removes


def test_cast_lm_head_to_fp32_keeps_the_layers_inputs_and_travels_with_copies(tiny_assets, batch):
    _, ids, attention, width = batch
    model = bf16_model(tiny_assets, tied=True)
    outputs = []

    def record(module, args, out):
        outputs.append(out)

    handle = model.model.embed_tokens.register_forward_hook(record)
    before = model(input_ids=ids, attention_mask=attention).logits
    handle.remove()
    cast_lm_head_to_fp32(model)
    cast_lm_head_to_fp32(model)  # again: no second hook, no change
    model.model.embed_tokens.register_forward_hook(record)  # after the cast's own hook: what the layers get
    after = model(input_ids=ids, attention_mask=attention).logits
    # the layers saw the same bf16 embeddings (the tied weight is float32 now, its values are the bf16 ones)
    assert outputs[1].dtype == torch.bfloat16 and torch.equal(outputs[0], outputs[1])
    assert len(model.model.embed_tokens._forward_hooks) == 2  # the test's and the cast's
    torch.testing.assert_close(after, before.float(), atol=0.07, rtol=0)  # bf16 rounding of the logits only
    copy = frozen_copy(model)  # the reference of a GRPO run with beta > 0
    torch.testing.assert_close(
        completion_logits(copy, ids, attention, width), completion_logits(model, ids, attention, width)
    )
    assert completion_logits(copy, ids, attention, width).dtype == torch.float32


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_cast_lm_head_to_fp32_refuses_a_lora_adapter_on_the_head(tiny_assets):
    peft = pytest.importorskip("peft")
    model = bf16_model(tiny_assets, tied=False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ConfigError, match="LoRA adapter on the LM head"):
        cast_lm_head_to_fp32(lora)
    beside = peft.get_peft_model(bf16_model(tiny_assets, tied=False), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    cast_lm_head_to_fp32(beside)  # an adapter elsewhere is fine
    assert beside.get_output_embeddings().weight.dtype == torch.float32
    # lora_modules_to_save=["lm_head"] trains a copy of the head: the copy and the base head are both float32
    saved = bf16_model(tiny_assets, tied=True)
    saved = peft.get_peft_model(saved, peft.LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    cast_lm_head_to_fp32(saved)
    ids = torch.tensor([[1, 2, 3]])
    assert saved(input_ids=ids).logits.dtype == torch.float32
    with saved.disable_adapter():
        assert saved(input_ids=ids).logits.dtype == torch.float32


def test_a_model_that_ships_its_own_code_is_explained_not_called_missing(tmp_path):
    from rlhfkit.errors import ModelLoadError
    from rlhfkit.models import load_policy

    config = {"model_type": "rlhfkit-custom", "auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomLM"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_custom.py").write_text("raise RuntimeError('never imported without trust')\n")
    with pytest.raises(ModelLoadError, match="ships custom code.*pass --trust_remote_code"):
        load_policy(str(tmp_path), torch.float32, "model_name_or_path")


def test_a_cached_hub_model_that_ships_its_own_code_is_not_called_missing(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from rlhfkit.models.loading import DEFAULT_HUB, _why_not_loaded
    from tests.hub_cache import cache_model

    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoModel": "m.X"}}))
    cache_model(tmp_path / "hub", "org/custom", saved)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = _why_not_loaded("org/custom", "model_name_or_path", DEFAULT_HUB, OSError("offline"))
    assert "ships custom code" in message and "not in the hub cache" not in message
    assert "not in the hub cache" in _why_not_loaded("org/absent", "model_name_or_path", DEFAULT_HUB, OSError("x"))
