import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.sampling import left_pad


@pytest.fixture(scope="module")
def batch(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets / "sft")
    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "sft").eval()
    queries, mask = left_pad([tokenizer(p)["input_ids"] for p in ("sort 4312=", "sort 12=")], tokenizer.pad_token_id)
    response = torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]])
    ids = torch.cat([queries, response], dim=1)
    attention = torch.cat([mask, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)], dim=1)
    return model, ids, attention, queries.shape[1]
