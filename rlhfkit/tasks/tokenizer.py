"""Character-level tokenizer for the built-in tasks, built with `tokenizers` and wrapped for transformers."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
# Every character any built-in task can emit, plus a few spares so new tasks keep token ids stable.
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz+-=*<>:,. "


def build_tokenizer(model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """One token per character; ids 0, 1, 2 are <pad>, <eos>, <unk>. No BOS: prompts are used as written.

    Why no BOS: TRL's GRPO tokenizes prompts with add_special_tokens=False, and PPO does not; without a BOS both
    see exactly the token ids the SFT model was trained on. Left padding, as generation needs.
    """
    return char_tokenizer(SPECIAL_TOKENS, (), ALPHABET, PAD, EOS, model_max_length, unk=UNK)


def char_tokenizer(
    specials, words, chars: str, pad: str, eos: str, model_max_length: int, unk: str | None = None
) -> PreTrainedTokenizerFast:
    """One token per character of `chars`, after the `specials` (special tokens, first ids) and the `words` (whole
    tokens kept in decoded text, as a BPE would merge a chat template's tags); ids in that order. An unknown character
    is `unk`'s id (default: the pad's, without an unk token). Left padding, as generation needs."""
    vocab = {token: i for i, token in enumerate([*specials, *words, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unk or pad))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char a piece
    backend.decoder = decoders.Fuse()  # join pieces without spaces
    backend.add_special_tokens(list(specials))
    if words:
        backend.add_tokens(list(words))
    extra = {"unk_token": unk} if unk else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        eos_token=eos,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        **extra,
    )
