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
Native decoding (unmask.engine) uses none of this. A new mode is one class here plus `@register`.
Semantics of each reference: shared/docs/reference-semantics.md.
"""

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from unmask.errors import UnmaskError
from unmask.knobs import NON_NEGATIVE, POSITIVE, Knob, choices, interval, non_negative_int, positive_int
from unmask.registry import Registry
from unmask.sampler.policy import CommitPolicy, FactorPolicy, FixedPolicy, make_policy
from unmask.sampler.proposal import ProposalConfig
from unmask.sampler.schedule import EvenSchedule, Schedule


@dataclass(frozen=True)
class LoopRules:
    """How the lockstep loop follows a reference where it differs from native decoding."""

    # at a full-canvas forward, candidates are all masks before the block end (not only the block)
    candidates_before_block_end: bool = False
    # run exactly steps_per_block forwards per block, even after the block is complete
    run_all_steps: bool = False
    # score and select over the whole recomputed window (non-candidates at -inf), so that random
    # draws and the selection among equal confidences see the reference's own shapes
    score_full_window: bool = False
    # stop a row once it has committed end of text (the references decode the whole canvas)
    early_stop: bool = True


COMPAT_MODES = Registry("compat", instances=True)  # name -> CompatMode instance
register = COMPAT_MODES.register


def get_mode(name: str) -> "CompatMode":
    return COMPAT_MODES.lookup(name, UnmaskError)


class CompatMode:
    name: ClassVar[str]
    reference: ClassVar[str]  # what it reproduces
    family: ClassVar[str]  # model family the reference sampler runs
    also: ClassVar[tuple[str, ...]] = ()  # other families whose release runs the same sampler
    policies: ClassVar[tuple[str, ...]]  # commit policies it reproduces
    caches: ClassVar[tuple[str, ...]]
    top_k_top_p: ClassVar[bool] = False
    equal_length_prompts: ClassVar[bool] = True  # the reference attends to padding
    loop: ClassVar[str] = "lockstep"  # lockstep (LLaDA, Fast-dLLM v1, Dream), fast-dllm-v2 or llada2
    tiles: ClassVar[bool] = True  # gen_length must be a multiple of block_length, steps of the blocks
    model_keys: ClassVar[tuple[str, ...]] = ()  # its settings a checkpoint's generation_config.json may give
    fields: ClassVar[dict[str, Knob]] = {}  # generation parameters only this reference reads
    takes_suffix: ClassVar[bool] = False  # its loop decodes a canvas with text after the hole
    unconditional: ClassVar[bool] = False  # it samples from nothing: a prompt may be empty
    rules: ClassVar[LoopRules] = LoopRules(candidates_before_block_end=True, score_full_window=True,
                                           early_stop=False)

    def resolve(self, p: Any) -> Any:
        """The parameters with what the mode implies applied."""
        return p

    def check(self, p: Any, subject: str | None = None) -> None:
        """Reject what the reference cannot do (p is resolved). `subject`: who refuses, when the
        mode's rules are a model's own (a renoising model's native sampler is its reference's)."""
        self._need(p, p.refresh_interval is None, f"refresh_interval {p.refresh_interval}", subject)
        self._need(p, p.min_tokens == 0, f"min_tokens {p.min_tokens}", subject)
        self._need(p, p.hole_length != "bound", "hole_length 'bound' (its holes have their exact length)", subject)
        self._need(p, p.top_k is None and p.top_p is None or self.top_k_top_p, "top_k / top_p", subject)
        self._need(p, p.confidence == "prob", f"confidence {p.confidence!r}", subject)
        self._need(p, p.policy in self.policies, f"policy {p.policy!r}", subject)
        self._need(p, p.cache in self.caches, f"cache {p.cache!r}", subject)

    def _need(self, p: Any, ok: bool, what: str, subject: str | None = None) -> None:
        """`subject`: who refuses (by default the mode: "compat 'x' does not support ...")."""
        if not ok:
            raise UnmaskError(f"{subject or f'compat {p.compat!r} does not support'} {what}")

    def check_family(self, family: str) -> None:
        """The model family first: a mode on another family is refused for that, before any setting."""
        if family not in (self.family, *self.also):
            raise UnmaskError(f"compat {self.name!r} reproduces {self.reference} on {self.family} models; this is a "
                              f"{family} model", param="compat")

    def check_prompts(self, prompts: list[list[int]], family: str) -> None:
        self.check_family(family)
        if self.equal_length_prompts and len({len(p) for p in prompts}) > 1:
            raise UnmaskError(f"compat {self.name!r} needs equal-length prompts (the reference does not mask padding)")

    def parts(self, p: Any, mask_id: int) -> tuple[ProposalConfig, CommitPolicy, Schedule]:
        raise NotImplementedError


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


def topk_rows(score: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """torch.topk(confidence_row, k) with non-candidates at -inf, as LLaDA's `generate`, Fast-dLLM's
    factor rule and Dream's `_sample` select: among exactly equal confidences torch.topk's choice
    depends on the row length and k (not simply the lowest index), so a token-exact port makes the
    same call on the same row. Rows are grouped by k into one batched call per distinct k (on CPU
    a batched topk picks what per-row calls pick; tests/test_compat.py checks it)."""
    conf = score.masked_fill(~candidates, -torch.inf)
    out = torch.zeros_like(candidates)
    for kk in k.unique().tolist():  # one host read per step; usually a single k
        if kk <= 0:
            continue
        rows = (k == kk).nonzero().squeeze(-1)
        idx = torch.topk(conf[rows], kk, dim=-1).indices
        out[rows[:, None], idx] = True
    return out & candidates


def _gumbel_proposal(p: Any, mask_id: int, precision: torch.dtype, random_dtype: torch.dtype,
                     need_entropy: bool) -> ProposalConfig:
    """LLaDA's and Fast-dLLM's proposal: Gumbel-max in float64, confidence gathered from a full
    softmax (bit-exact with the references), 'random' remasking as a random score."""
    return ProposalConfig(
        mask_id=mask_id, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
        confidence="random" if p.remasking == "random" else p.confidence, sampling="gumbel",
        precision=precision, random_dtype=random_dtype, exact_softmax=True, need_entropy=need_entropy,
    )


@register
class FastDLLM(CompatMode):
    """Fast-dLLM v1 (latest) `generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`."""

    name = "fast-dllm"
    reference = "the LLaDA sampler of Fast-dLLM v1"
    family = "llada"
    also = ("llada_moe",)
    takes_suffix = True
    policies = ("fixed", "threshold", "factor")
    caches = ("none", "prefix", "dual")

    def parts(self, p, mask_id):
        # fixed: a descending sort of the full row, first k (the latest get_transfer_index); factor:
        # torch.topk per row; threshold: argmax, which picks the first of equal maxima on any row
        policy = FactorPolicy(p.factor, top=topk_rows) if p.policy == "factor" else make_policy(p)
        # the factor path draws float32 uniforms for 'random'; get_transfer_index float64
        random_dtype = torch.float32 if p.policy == "factor" else torch.float64
        proposal = _gumbel_proposal(p, mask_id, torch.float64, random_dtype, policy.needs_entropy)
        return proposal, policy, EvenSchedule(p.steps_per_block)


@register
class LLaDA(CompatMode):
    """LLaDA's official `generate`: fixed steps, every step run even when nothing is left."""

    name = "llada"
    reference = "the LLaDA sampler"
    family = "llada"
    also = ("llada_moe",)  # LLaDA-MoE's release decodes with LLaDA's generate
    takes_suffix = True
    policies = ("fixed",)
    caches = ("none",)
    rules = replace(CompatMode.rules, run_all_steps=True)

    def parts(self, p, mask_id):
        proposal = _gumbel_proposal(p, mask_id, torch.float32, torch.float32, False)
        return proposal, FixedPolicy(top=topk_rows), EvenSchedule(p.steps_per_block)


DREAM_ALGS = {"origin": "prob", "maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}
OPEN_DCODER_ALGS = (*DREAM_ALGS, "p2")
# Dream's and Open-dCoder's samplers share their algorithm and timestep floor (one knob each)
ALG = Knob(None, str, "the sampler's algorithm, with compat dream (origin, maskgit_plus, topk_margin, entropy) or "
           "open-dcoder (also p2)", choices(OPEN_DCODER_ALGS))
EPS = Knob(1e-3, float, "Dream's / Open-dCoder's timestep floor, with compat dream or open-dcoder",
           interval(0, 1, hi_open=True))


@register
class Dream(CompatMode):
    """Dream's `diffusion_generate`: the whole canvas as one block, Dream's timestep schedule, the
    algorithms origin / maskgit_plus / topk_margin / entropy, categorical sampling."""

    name = "dream"
    reference = "Dream's diffusion_generate"
    family = "dream"
    takes_suffix = True
    policies = ("fixed",)
    caches = ("none",)
    top_k_top_p = True
    equal_length_prompts = False
    rules = replace(CompatMode.rules, run_all_steps=True)
    fields: ClassVar[dict] = {"alg": ALG, "eps": EPS}

    def resolve(self, p):
        return replace(p, block_length=p.gen_length, alg=p.alg or "origin")

    def check(self, p, subject=None):
        if p.alg not in DREAM_ALGS:
            raise UnmaskError(f"unknown alg {p.alg!r}; choose one of {', '.join(DREAM_ALGS)}")
        if p.policy != "fixed":
            raise UnmaskError(f"compat 'dream' does not support policy {p.policy!r} (choose the algorithm with alg)")
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r}", subject)
        super().check(p, subject)

    def parts(self, p, mask_id):
        schedule = DreamSchedule(p.total_steps, p.eps)
        policy = OriginPolicy(schedule) if p.alg == "origin" else FixedPolicy(top=topk_rows)
        proposal = ProposalConfig(mask_id=mask_id, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                  confidence=DREAM_ALGS[p.alg], sampling="categorical")
        return proposal, policy, schedule


class DreamSchedule:
    """Dream's schedule: timesteps linspace(1, eps, steps+1); at step i commit
    int(remaining * (1 - s/t)) with t, s = ts[i], ts[i+1] (float32 as upstream), all on the last step."""

    def __init__(self, steps: int, eps: float = 1e-3) -> None:
        self.steps = steps
        self.timesteps = torch.linspace(1, eps, steps + 1)

    def start_block(self, masked: torch.Tensor) -> None:
        pass

    def transfer_fraction(self, step: int) -> torch.Tensor:
        t, s = self.timesteps[step], self.timesteps[step + 1]
        return 1 - s / t

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        if step >= self.steps - 1:
            return remaining
        frac = self.transfer_fraction(step).to(remaining.device)
        return (remaining.float() * frac).long()

    def select_rows(self, keep: torch.Tensor) -> None:
        pass


@dataclass
class OriginPolicy:
    """Dream's "origin": each masked position is committed independently with probability
    1 - s/t (1 on the last step). Uniforms are drawn in row-major order over the candidates,
    as upstream draws them over the flattened masked positions."""

    schedule: DreamSchedule
    uses_schedule: bool = False
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        if step >= self.schedule.steps - 1:
            return candidates.clone()
        frac = self.schedule.transfer_fraction(step)
        n = int(candidates.sum())
        u = torch.full(candidates.shape, 2.0, device=candidates.device)
        u[candidates] = torch.rand(n, generator=generator, device=candidates.device)
        return candidates & (u < frac.to(u.device))


@register
class OpenDCoder(CompatMode):
    """Open-dCoder's `diffusion_generate` (pengzhangzhi/Open-dLLM,
    veomni/models/transformers/qwen2/generation_utils.py) on an Open-dCoder checkpoint: the whole
    canvas as one block, Dream's timesteps, the algorithms origin, maskgit_plus, topk_margin,
    entropy and p2 (which masks the least confident generated tokens again each step), greedy or
    sampled (temperature, top_p, top_k, alg_temp); infilling as its eval does it (prompt, masks,
    suffix). Loop: unmask.reference.open_dcoder."""

    name = "open-dcoder"
    reference = "Open-dCoder's diffusion_generate"
    family = "open_dcoder"
    policies = ("fixed",)
    caches = ("none",)
    loop = "open-dcoder"
    takes_suffix = True
    top_k_top_p = True
    fields: ClassVar[dict] = {"alg": ALG, "eps": EPS, "alg_temp": Knob(
        None, float, "compat open-dcoder: Gumbel temperature of the positions maskgit_plus, topk_margin and entropy "
        "pick (0: the most confident)", NON_NEGATIVE)}

    def resolve(self, p):
        return replace(p, block_length=p.gen_length, alg=p.alg or "entropy")  # MDMGenerationConfig's default

    def check(self, p, subject=None):
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r} (set alg)", subject)
        super().check(p, subject)
