"""Reference modes (`GenerationParams(compat=...)`, `--compat`): what each reproduced reference
sampler supports and how the reference loops run it.

A mode maps its name to
- the parameters it supports and what it implies (`resolve`, `check`),
- the prompts it accepts (`check_prompts`: the references attend to padding, Dream's needs a
  Dream model),
- its decoding parts for the lockstep loop (`parts`: proposal configuration, commit policy,
  schedule) and the rules by which that loop follows the reference (`LoopRules`),
- or, with `loop`, its own loop (Fast-dLLM v2: unmask.reference.fast_dllm_v2; LLaDA2.1:
  unmask.reference.llada2).
Native decoding (unmask.engine) uses none of this. A new mode is one file here (its class and
`@register`) plus its import below.
Semantics of each reference: shared/docs/reference-semantics.md.
"""

# the modes register in this order (the order of their choices in help and errors)
# isort: off
from unmask.compat import fast_dllm_v2, llada2, diffusion_gemma, dllm, kuleshov  # noqa: E402, F401
from unmask.compat import fast_dllm, llada, dream  # noqa: E402, F401
# isort: on
from unmask.compat.base import COMPAT_MODES, CompatMode, LoopRules, get_mode, register, topk_rows  # noqa: E402
from unmask.compat.dream import DreamSchedule, OriginPolicy  # noqa: E402

__all__ = ["COMPAT_MODES", "CompatMode", "LoopRules", "get_mode", "register", "topk_rows", "DreamSchedule",
           "OriginPolicy"]
