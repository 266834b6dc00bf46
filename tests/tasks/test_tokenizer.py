from rlhfkit.tasks.tokenizer import ALPHABET, build_tokenizer


def test_round_trip_every_character():
    tok = build_tokenizer()
    text = "sort 52913=" + ALPHABET
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS/EOS added
    assert tok.decode(ids) == text


def test_special_tokens_distinct_and_stripped():
    tok = build_tokenizer()
    assert len({tok.pad_token_id, tok.eos_token_id, tok.unk_token_id}) == 3
    assert tok.bos_token_id is None
    ids = tok("ab")["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok("<eos>")["input_ids"] == [tok.eos_token_id]


def test_left_padding_and_save_load(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    batch = tok(["sort 12=", "sort 1234="], padding=True)
    assert tok.padding_side == "left"
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0] + [1] * 8
    assert tok.decode(batch["input_ids"][1]) == "sort 1234="
