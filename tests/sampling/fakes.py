"""Models whose forward refuses some of the lean loop's arguments, as custom remote code and older architectures do."""

from transformers import LlamaForCausalLM

from rlhfkit.sampling import decoders


class RaisesOnLogitsToKeep(LlamaForCausalLM):
    """Like remote code that passes **kwargs on to a layer which does not know logits_to_keep."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        if "logits_to_keep" in kwargs:
            raise TypeError("LlamaModel.forward() got an unexpected keyword argument 'logits_to_keep'")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)


def listed_forward(model, cache, past_key_values, **arguments):
    """LlamaForCausalLM's forward for a subclass that lists its arguments: the KV cache, passed by either name, goes
    on under the name the installed transformers takes ('cache' from 5.24 on)."""
    cache = cache if cache is not None else past_key_values
    name = "cache" if decoders._transformers_names_it_cache() else "past_key_values"
    return LlamaForCausalLM.forward(model, **arguments, **{name: cache})


class NoLogitsToKeepInSignature(LlamaForCausalLM):
    """Like an older architecture whose forward lists its arguments and has no logits_to_keep (nor **kwargs)."""

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        cache=None,  # the KV cache's name since transformers 5.24, which its generate passes
        use_cache=None,
        return_dict=None,
    ):
        return listed_forward(
            self, cache, past_key_values, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=use_cache, return_dict=return_dict,
        )  # fmt: skip


class NoCachePosition(LlamaForCausalLM):
    """A forward that lists the lean loop's arguments but not cache_position (what the static cache needs)."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
        use_cache=None, logits_to_keep=0,
    ):  # fmt: skip
        return listed_forward(
            self, cache, past_key_values, input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
        )  # fmt: skip


class UnrelatedTypeError(LlamaForCausalLM):
    def forward(self, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")
