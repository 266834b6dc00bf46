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
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *ALPHABET])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char a piece
    backend.decoder = decoders.Fuse()  # join pieces without spaces
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
