"""LLaDA2.1's token-to-token editing."""

from dataclasses import dataclass
from typing import Any, ClassVar

from unmask.knobs import UNIT, Knob, non_negative_int
from unmask.sampler.policy.base import Registered, Revision, register
from unmask.sampler.policy.threshold import ThresholdPolicy


@register
@dataclass
class EditPolicy(Registered):
    """Mask-to-token plus token-to-token editing (LLaDA2.1): commit as the threshold policy does
    (every candidate with confidence >= threshold, plus the most confident), and in the same step
    replace each committed token of the open block whose proposal differs with probability above
    `edit_threshold`. Once the block has no mask, up to `max_post_steps` more steps edit it; the
    block ends at the first of them that edits nothing. Edits stay inside the open block (earlier
    blocks, and so every cache of them, are never touched); the prompt is never edited."""

    name: ClassVar[str] = "edit"
    knob: ClassVar[str] = "edit_threshold"
    bench_knob: ClassVar[str] = "edit threshold"
    fields: ClassVar[dict] = {
        "edit_threshold": Knob(None, float, "edit policy (and compat llada2): replace a committed token of the open "
                               "block by the model's argmax when that differs with probability above this "
                               "(token-to-token editing)", UNIT),
        "max_post_steps": Knob(16, int, "edit policy: editing steps a block may take after its last mask is "
                               "committed", non_negative_int),
    }
    revises: ClassVar[bool] = True
    threshold: float
    edit_threshold: float
    post_steps: int = 16

    reads: ClassVar[tuple[str, ...]] = ("threshold",)

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        return ("edit_threshold", "max_post_steps")

    @classmethod
    def from_params(cls, p: Any) -> "EditPolicy":
        return cls(p.threshold, DEFAULT_EDIT_THRESHOLD if p.edit_threshold is None else p.edit_threshold,
                   p.max_post_steps)

    def select(self, score, entropy, candidates, quota, step, generator):
        return ThresholdPolicy(self.threshold).select(score, entropy, candidates, quota, step, generator)

    def revise(self, r: Revision):
        return r.editable & (r.prob > self.edit_threshold) & (r.tokens != r.current), None


DEFAULT_EDIT_THRESHOLD = 0.9  # LLaDA2.1's generate default (its "quality mode" recommends 0.5 with threshold 0.7)
