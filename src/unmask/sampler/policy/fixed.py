"""LLaDA's fixed schedule."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from unmask.knobs import Knob, choices
from unmask.sampler.policy.base import Registered, register, take_top


@register
@dataclass
class FixedPolicy(Registered):
    """LLaDA: commit the schedule's quota, most confident first (or in random order when the
    score is a random draw). Its knob is the schedule (`steps`), not a policy parameter."""

    name: ClassVar[str] = "fixed"
    bench_knob: ClassVar[str] = "tokens per step"
    uses_schedule: ClassVar[bool] = True
    fields: ClassVar[dict] = {"remasking": Knob("low_confidence", str, "fixed policy's order: most confident first, "
                                                "or random", choices(("low_confidence", "random")), from_model=True)}
    top: Callable = field(default=take_top, repr=False)  # how the k best are picked (compat: the reference's call)

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        return ("steps", "remasking")

    @classmethod
    def from_params(cls, p: Any) -> "FixedPolicy":
        return cls()

    @classmethod
    def bench_params(cls, value: float, gen_length: int) -> dict:
        k = int(value)
        if k != value or k < 1 or gen_length % k:
            raise ValueError(f"fixed:{value:g}: tokens per step must be an integer that divides gen_length {gen_length}")
        return {"policy": cls.name, "steps": gen_length // k}

    def select(self, score, entropy, candidates, quota, step, generator):
        return self.top(score, candidates, quota)
