"""The reference samplers, reproduced token for token (`compat` modes): kept apart from native
decoding, which is the request engine's (unmask.engine).

- modes.py: each reproduced reference, what it supports, its parts and loop rules;
- lockstep.py: LLaDA's, Fast-dLLM v1's and Dream's lockstep batch loop;
- fast_dllm_v2.py: Fast-dLLM v2's `batch_sample`;
- llada2.py: LLaDA2.1's `generate` (mask-to-token plus token-to-token editing);
- diffusion_gemma.py: DiffusionGemma's `generate` (renoising: entropy bound, self-conditioning);
- dllm.py: dllm's MDLM and BD3LM samplers (its A2D models);
- open_dcoder.py: Open-dCoder's diffusion_generate (Dream's timesteps; p2 remasks);
- bd3lms.py: the BD3-LM repository's semi-AR sampler (MDLM and BD3-LM models);
- mdlm.py: the MDLM repository's `_sample` (MDLM models, from an empty canvas);
- and the references' left-padded canvas is unmask.canvas (shared with training)."""

import importlib


def run_reference(model, tokens, prompts: list[list[int]], params, suffixes: list[list[int]] | None = None):
    """One batch through the loop of the reference `params.compat` names (params accepted):
    a unmask.trace.Decoded. `suffixes` (infilling): the lockstep loop's references only
    (unmask.inputs.check_suffix). (Imports are local: params.py imports modes.py from this package.)"""
    from unmask.compat import get_mode

    mode = get_mode(params.compat)
    if suffixes is not None and not mode.takes_suffix:
        raise ValueError(f"the {mode.loop} loop takes no suffix")
    module, name = LOOPS[mode.loop]
    decode = getattr(importlib.import_module(f"unmask.reference.{module}"), name)
    return decode(model, tokens, prompts, params, *([suffixes] if mode.takes_suffix else []))


# a compat mode's `loop` -> (module of this package, its decode function)
LOOPS = {
    "lockstep": ("lockstep", "decode_reference"),
    "fast-dllm-v2": ("fast_dllm_v2", "decode_fast_dllm_v2"),
    "diffusion-gemma": ("diffusion_gemma", "decode_diffusion_gemma"),
    "llada2": ("llada2", "decode_llada2"),
    "dllm-mdlm": ("dllm", "decode_mdlm"),
    "dllm-bd3lm": ("dllm", "decode_bd3lm"),
    "open-dcoder": ("open_dcoder", "decode_open_dcoder"),
    "bd3lms": ("bd3lms", "decode_bd3lms"),
    "mdlm": ("mdlm", "decode_mdlm_repo"),
}
