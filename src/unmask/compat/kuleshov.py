"""kuleshov-group's own BD3-LM and MDLM samplers."""

from dataclasses import replace
from typing import ClassVar

from unmask.compat.base import CompatMode, register
from unmask.knobs import Knob, choices


class _Kuleshov(CompatMode):
    """What the BD3-LM and MDLM repositories' samplers share: they always sample, at temperature 1
    (the unset 0 becomes 1), and unmask by their own draws."""

    policies = ("fixed",)
    caches = ("none",)
    tiles = False  # their own canvases, checked by their loops

    def resolve(self, p):
        return replace(p, temperature=1.0 if p.temperature == 0 else p.temperature)

    def check(self, p, subject=None):
        self._need(p, p.temperature == 1.0, f"temperature {p.temperature} (it samples at temperature 1 only)", subject)
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r} (it unmasks by its own draws)",
                   subject)
        super().check(p, subject)


@register
class BD3LMs(_Kuleshov):
    """The BD3-LM repository's sampler (kuleshov-group/bd3lms `Diffusion._semi_ar_sampler`) on an
    MDLM or BD3-LM checkpoint: sequences from BOS (a prompt, if any, after it), in strides of the
    model's block (MDLM: one), `steps` per stride (its T; default 5000, as its generation scripts),
    first-hitting or DDPM updates, `top_p` as its nucleus_p, sampling at temperature 1 (it has no
    other), seed the torch.manual_seed before the call. Loop: unmask.reference.bd3lms."""

    name = "bd3lms"
    reference = "BD3-LM's semi-AR sampler (kuleshov-group/bd3lms)"
    family = "bd3lm"
    also = ("mdlm",)
    loop = "bd3lms"  # strides of the model's own block, checked by the loop against the canvas
    top_k_top_p = True
    fields: ClassVar[dict] = {"first_hitting": Knob(
        None, bool, "compat bd3lms: commit one uniformly chosen mask per forward (the reference's default, true), "
        "or false: its DDPM update over `steps` timesteps")}

    def resolve(self, p):
        return replace(super().resolve(p), first_hitting=True if p.first_hitting is None else p.first_hitting)

    def check(self, p, subject=None):
        self._need(p, p.top_k is None, f"top_k {p.top_k} (its nucleus is top_p)", subject)
        super().check(p, subject)


@register
class MDLMRepo(_Kuleshov):
    """The MDLM repository's sampler (kuleshov-group/mdlm `Diffusion._sample`) on an MDLM checkpoint:
    the whole sequence from masks (a prompt, possibly empty, committed first), `steps` timesteps
    (default 128, its config's), `predictor` ddpm_cache (its default) or ddpm, `noise_removal`,
    sampling at temperature 1, seed the torch.manual_seed before the call. Loop:
    unmask.reference.mdlm."""

    name = "mdlm"
    reference = "MDLM's _sample (kuleshov-group/mdlm)"
    family = "mdlm"
    loop = "mdlm"  # one canvas, no blocks
    unconditional = True
    fields: ClassVar[dict] = {
        "predictor": Knob(None, str, "compat mdlm: its sampling.predictor, ddpm_cache (default: a step that changes "
                          "nothing reuses its probabilities) or ddpm", choices(("ddpm_cache", "ddpm"))),
        "noise_removal": Knob(None, bool, "compat mdlm: one last forward commits the argmax at every mask left "
                              "(its default, true)"),
    }

    def resolve(self, p):
        return replace(super().resolve(p), predictor=p.predictor or "ddpm_cache",
                       noise_removal=True if p.noise_removal is None else p.noise_removal)
