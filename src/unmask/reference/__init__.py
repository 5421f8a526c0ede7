"""The reference samplers, reproduced token for token (`compat` modes): kept apart from native
decoding, which is the request engine's (unmask.engine).

- modes.py: each reproduced reference, what it supports, its parts and loop rules;
- lockstep.py: LLaDA's, Fast-dLLM v1's and Dream's lockstep batch loop;
- fast_dllm_v2.py: Fast-dLLM v2's `batch_sample`;
- llada2.py: LLaDA2.1's `generate` (mask-to-token plus token-to-token editing);
- diffusion_gemma.py: DiffusionGemma's `generate` (renoising: entropy bound, self-conditioning);
- and the references' left-padded canvas is unmask.canvas (shared with training)."""


def run_reference(model, tokens, prompts: list[list[int]], params, suffixes: list[list[int]] | None = None):
    """One batch through the loop of the reference `params.compat` names (params accepted):
    a unmask.trace.Decoded. `suffixes` (infilling): the lockstep loop's references only
    (unmask.inputs.check_suffix). (Imports are local: params.py imports modes.py from this package.)"""
    from unmask.compat import get_mode

    loop = get_mode(params.compat).loop
    if suffixes is not None and loop != "lockstep":
        raise ValueError(f"the {loop} loop takes no suffix")
    if loop == "fast-dllm-v2":
        from unmask.reference.fast_dllm_v2 import decode_fast_dllm_v2

        return decode_fast_dllm_v2(model, tokens, prompts, params)
    if loop == "diffusion-gemma":
        from unmask.reference.diffusion_gemma import decode_diffusion_gemma

        return decode_diffusion_gemma(model, tokens, prompts, params)
    if loop == "llada2":
        from unmask.reference.llada2 import decode_llada2

        return decode_llada2(model, tokens, prompts, params)
    from unmask.reference.lockstep import decode_reference

    return decode_reference(model, tokens, prompts, params, suffixes)
