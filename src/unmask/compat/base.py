"""The mode interface (CompatMode), its registry and the selection and proposal the references share."""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unmask.errors import UnmaskError
from unmask.knobs import Knob
from unmask.registry import Registry
from unmask.sampler.policy import CommitPolicy
from unmask.sampler.proposal import ProposalConfig
from unmask.sampler.schedule import Schedule


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
        self._need(p, p.hole_length not in ("bound", "grow", "consensus"),
                   f"hole_length {p.hole_length!r} (its holes have their exact length)", subject)
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


def gumbel_proposal(p: Any, mask_id: int, precision: torch.dtype, random_dtype: torch.dtype,
                     need_entropy: bool) -> ProposalConfig:
    """LLaDA's and Fast-dLLM's proposal: Gumbel-max in float64, confidence gathered from a full
    softmax (bit-exact with the references), 'random' remasking as a random score."""
    return ProposalConfig(
        mask_id=mask_id, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
        confidence="random" if p.remasking == "random" else p.confidence, sampling="gumbel",
        precision=precision, random_dtype=random_dtype, exact_softmax=True, need_entropy=need_entropy,
    )
