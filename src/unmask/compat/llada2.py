"""LLaDA2.x's sampler (its own loop: unmask.reference.llada2)."""

from dataclasses import replace

from unmask.compat.base import CompatMode, register


@register
class LLaDA2(CompatMode):
    """LLaDA2.1's `generate` (its model code) on a LLaDA2.x checkpoint: blocks of `block_length`
    from position 0 (its block_length argument, 32 by default, sets the attention blocks),
    mask-to-token above `threshold` with its most-confident fallback, token-to-token edits above
    `edit_threshold` (off when not given), `max_post_steps` editing steps after a block's last
    mask, and `early_stop` as its eos_early_stop. Greedy only (its temperature-0 path).
    SGLang's JointThreshold differs (docs/editing.md) and is not this mode."""

    name = "llada2"
    reference = "LLaDA2.1's generate"
    family = "llada2"
    policies = ("threshold", "edit")
    caches = ("none",)
    equal_length_prompts = False  # each row is decoded as if alone: positions from 0, no padding
    loop = "llada2"
    tiles = False  # a canvas of ceil((prompt + gen_length) / block_length) blocks

    def resolve(self, p):
        return replace(p, policy="edit")

    def check(self, p, subject=None):
        self._need(p, p.temperature == 0, f"temperature {p.temperature} (it is reproduced for greedy decoding)",
                   subject)
        self._need(p, p.steps is None, f"steps {p.steps} (its generate commits by threshold, not by a schedule)",
                   subject)
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r}", subject)
        super().check(p, subject)
