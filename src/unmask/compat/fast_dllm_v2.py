"""Fast-dLLM v2's block-diffusion sampler (its own loop: unmask.reference.fast_dllm_v2)."""

from dataclasses import replace

from unmask.compat.base import CompatMode, register


@register
class FastDLLMv2(CompatMode):
    """Fast-dLLM v2's `batch_sample` (v2/generation_functions.py) on a Fast-dLLM v2 checkpoint:
    the block is the model's bd_size, `block_length` is small_block_size (a divisor of it), cache
    "exact" is use_block_cache=False and "exact-dual" use_block_cache=True, greedy only (its T=0
    path). Selection: per row, every open position of the sub-block with p strictly above the
    threshold, and the row's argmax (torch's argmax: the first of equal maxima)."""

    name = "fast-dllm-v2"
    reference = "Fast-dLLM v2's batch_sample"
    family = "fast_dllm_v2"
    policies = ("threshold",)
    caches = ("exact", "exact-dual")
    equal_length_prompts = False  # prompts are right-padded with MASK, which is generated
    loop = "fast-dllm-v2"

    def resolve(self, p):
        """Its only rule is the threshold, and it always keeps a KV cache."""
        return replace(p, policy="threshold", cache="exact" if p.cache == "none" else p.cache)

    def check(self, p, subject=None):
        self._need(p, p.temperature == 0, f"temperature {p.temperature} (it is reproduced for greedy decoding)",
                   subject)
        self._need(p, p.steps is None, f"steps {p.steps}", subject)
        super().check(p, subject)
