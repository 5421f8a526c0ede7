"""dllm's MDLM and BD3-LM samplers (ZHZisZZ/dllm)."""

from dataclasses import replace
from typing import ClassVar

from unmask.compat.base import CompatMode, register
from unmask.knobs import Knob, choices

# the attention implementation dllm's model runs with: its boolean block mask is a mask under
# transformers' sdpa (the default) and a +1 score bias under eager (unmask.reference.dllm)
ATTN_IMPLEMENTATION = Knob(None, str, "compat dllm-mdlm / dllm-bd3lm: the attention implementation the reference "
                           "model runs with: sdpa (transformers' default, and dllm's) or eager, which adds BD3LM's "
                           "boolean block mask to the scores instead of masking (default sdpa)",
                           choices(("sdpa", "eager")))


class _Dllm(CompatMode):
    """What dllm's two samplers share: Gumbel sampling at a temperature (greedy at 0; the seed is
    the `torch.manual_seed` before the call), low-confidence or random remasking, dllm's linear
    schedule (total steps spread as ceil(steps / blocks) per block), any gen_length and block_length."""

    family = "a2d"
    policies = ("fixed",)
    equal_length_prompts = False  # each sampler pads and masks its own way
    tiles = False  # the last block may be partial; steps need not divide
    fields: ClassVar[dict] = {"attn_implementation": ATTN_IMPLEMENTATION}

    def resolve(self, p):
        return replace(p, attn_implementation=p.attn_implementation or "sdpa")


@register
class DllmMDLM(_Dllm):
    """dllm's `MDLMSampler.sample` (dllm/core/samplers/mdlm.py) on an A2D checkpoint: the whole
    canvas every step, blocks counted from each row's prompt end. Loop: unmask.reference.dllm."""

    name = "dllm-mdlm"
    reference = "dllm's MDLMSampler"
    caches = ("none",)
    loop = "dllm-mdlm"
    takes_suffix = True  # MDLMSampler.infill: prompt + masks + suffix


@register
class DllmBD3LM(_Dllm):
    """dllm's `BD3LMSampler.sample` (dllm/core/samplers/bd3lm.py) on an A2D checkpoint: block
    attention over blocks of `block_length`, a prefix forward per block whose K/V the block's steps
    reuse (cache "exact"). Loop: unmask.reference.dllm."""

    name = "dllm-bd3lm"
    reference = "dllm's BD3LMSampler"
    caches = ("exact",)
    loop = "dllm-bd3lm"

    def resolve(self, p):
        return replace(super().resolve(p), cache="exact" if p.cache == "none" else p.cache)
