"""DiffusionGemma's renoising sampler, as its reference runs it."""

from dataclasses import replace
from typing import ClassVar

from unmask.compat.base import CompatMode, register
from unmask.errors import UnmaskError
from unmask.knobs import NON_NEGATIVE, POSITIVE, Knob, non_negative_int, positive_int


@register
class DiffusionGemmaMode(CompatMode):
    """DiffusionGemma's `generate` (transformers' models/diffusion_gemma/generation_diffusion_gemma.py)
    on a DiffusionGemma checkpoint: per canvas an encoder pass, then up to max_denoising_steps
    denoising steps at a temperature falling from t_max to t_min, entropy-bound acceptance (gamma),
    uniform renoising, self-conditioning, stable-and-confident stopping; gen_length is its
    max_new_tokens (whole canvases), seed the torch.manual_seed before the call. Loop:
    unmask.reference.diffusion_gemma."""

    name = "diffusion-gemma"
    reference = "DiffusionGemma's generate (transformers)"
    family = "diffusion_gemma"
    policies = ("entropy",)
    caches = ("none",)
    equal_length_prompts = False  # left-padded, with the padding masked as the reference masks it
    loop = "diffusion-gemma"
    tiles = False  # whole canvases of the model's canvas_length
    fields: ClassVar[dict] = {
        "t_max": Knob(None, float, "compat diffusion-gemma: the temperature of a canvas's first denoising step "
                      "(default 0.8); it falls linearly towards t_min", POSITIVE, from_model=True),
        "t_min": Knob(None, float, "compat diffusion-gemma: the temperature the schedule falls to (default 0.4)",
                      NON_NEGATIVE, from_model=True),
        "max_denoising_steps": Knob(None, int, "compat diffusion-gemma: denoising steps per canvas at most "
                                    "(default 48)", positive_int, from_model=True),
        "stability_threshold": Knob(None, int, "compat diffusion-gemma: a canvas stops once its argmax stayed the "
                                    "same for this many steps (default 1) and it is confident", non_negative_int,
                                    from_model=True),
        "confidence_threshold": Knob(None, float, "compat diffusion-gemma: ... confident: the mean entropy of its "
                                     "positions is below this (default 0.005)", POSITIVE, from_model=True),
    }
    model_keys = ("gamma", *fields)  # gamma: its entropy bound, the entropy policy's knob
    DEFAULTS: ClassVar[dict] = {"t_max": 0.8, "t_min": 0.4, "max_denoising_steps": 48, "stability_threshold": 1,
                                "confidence_threshold": 0.005, "gen_length": 256}  # _get_default_generation_params

    def resolve(self, p):
        unset = {k: v for k, v in self.DEFAULTS.items() if k != "gen_length" and getattr(p, k) is None}
        return replace(p, policy="entropy", **unset)

    def check(self, p, subject=None):
        self._need(p, p.temperature == 0, f"temperature {p.temperature} (its temperature falls from t_max to t_min)",
                   subject)
        self._need(p, p.steps is None, f"steps {p.steps} (use max_denoising_steps, per canvas)", subject)
        if p.t_max <= p.t_min:
            raise UnmaskError(f"t_max {p.t_max} must be above t_min {p.t_min}", param="t_max")
        super().check(p, subject)
