"""The masked row kind: masked diffusion over a canvas of [MASK] tokens, in blocks (LLaDA, Dream,
the embedded models; block-diffusion models with cache "exact"; the autoregressive twin with cache
"causal": blocks of one token).

Every row has its own canvas, block position, step counter, schedule, K/V rows and parameters
(rows.py RowState), so a step is tensor code over all rows, whatever block each row is in. One
step of the rows the engine runs:
1. `cost`: each setting's cache policy (unmask.cache) plans its rows: a full forward, or a window
   against the row's K/V; the plans are merged (the kind never looks inside a policy), and the
   positions each row computes are its cost (full rows queue behind the windows);
2. runner.py: one forward for the window rows, then — when a verifying cache doubted some cached
   rows — their recomputation is planned, then one forward for the full rows (each row at its own
   columns) and one more window for doubted rows that recompute there (work.py);
3. commit.py after each forward: proposals, the commit policy's choice and the schedule's quota,
   per setting;
4. postprocess.py: blocks advance and stops are found (`settle`); the next step's plan is made
   from the new state (`_ahead`); one transfer reads the step's report and that plan's sizes, so
   a step that follows a step without joins or departures reads the host once (its budget and
   forwards sized from what was read ahead).

Greedy output of a request does not depend on what else runs, up to rounding: padding is masked,
positions are each row's own, and each request samples from its own generator when it has a seed.
The rounding can differ (attention over another padded width, a linear kernel's row count:
docs/real-models.md, "Reproducible tokens"), and so can a token where two were within it.
"""

import itertools
import time
from dataclasses import replace

import torch

from unmask.cache import CACHES
from unmask.cache.base import Plan
from unmask.compat import get_mode
from unmask.engine import postprocess
from unmask.engine.commit import Committer
from unmask.engine.constrained import Constrained
from unmask.engine.grow import Growth
from unmask.engine.kind import (ROW_KINDS, Cost, KindContext, Report, Takes, check_compat_family, suffix_refusal,
                                template_refusal)
from unmask.engine.logprobs import Logprobs
from unmask.engine.parts import build_parts
from unmask.engine.postprocess import MaskedStats
from unmask.engine.rows import RowState
from unmask.engine.runner import ModelRunner
from unmask.engine.work import Forward, StepWork, shape
from unmask.errors import UnmaskError
from unmask.kv.prefix import PrefixStore
from unmask.params import PARAM_FIELDS, RENOISE_KNOBS, SHAPE, GenerationParams, setting_key

AR_FIELDS = ("gen_length", "temperature", "seed", "early_stop", "min_tokens")  # what an autoregressive model honours
_REFERENCE = GenerationParams()
_AR = {"policy": "fixed", "cache": "causal", "refresh_interval": None, "remasking": "low_confidence", "confidence": "prob"}
_KIND_TEXT = {"full": "this model attends over the whole canvas",
              "block": "this block-diffusion model's finished blocks are cached exactly",
              "causal": "this causal model keeps an exact KV cache"}
_SUITS_TEXT = {("block",): "is exact only for block-diffusion models (config bd_size)",
               ("full",): "approximates a full-attention model's K/V",
               ("causal",): "is a causal model's exact KV cache (the AR twin's)"}


def accept_causal(params: GenerationParams, arch, given: frozenset | None) -> GenerationParams:
    """An autoregressive model decodes one token per forward with its exact KV cache: it takes
    AR_FIELDS; any other field set to something else than the reference setting is refused by
    name (a knob it would ignore must not look honoured). Its parameters become blocks of one
    token, the fixed schedule and cache "causal"."""
    if given is None:  # what differs from the reference setting and from what this sets
        given = frozenset(f for f in PARAM_FIELDS if f not in SHAPE and getattr(params, f) != getattr(_REFERENCE, f)
                          and not (f in _AR and getattr(params, f) == _AR[f]))
    wrong = sorted(given - set(AR_FIELDS))
    if wrong:
        raise UnmaskError(f"{', '.join(wrong)}: not used by an autoregressive model (it decodes one token per "
                          f"forward with its KV cache); it takes {', '.join(AR_FIELDS)}", param=wrong[0])
    return replace(params, block_length=1, steps=params.gen_length, **_AR).check()


def causal_takes(arch, tokens, decodes: str = "autoregressive", **more) -> Takes:
    """An autoregressive model's contract: text after a hole laid out prefix-suffix-middle when
    its tokenizer has fill-in-the-middle tokens; one hole at the end; its own decoding (no fast
    defaults); no commit-time diagnosis (its cache is exact)."""
    suffix = None if tokens.fim is not None else suffix_refusal(
        arch, "an autoregressive model attends to earlier tokens only (and its tokenizer has no fill-in-the-middle "
              "tokens)")
    return Takes("autoregressive", suffix=suffix, psm=tokens.fim is not None,
                 template=template_refusal(arch, "attends left to right (give one hole at the end of the text)"),
                 fast=False, diagnose="unmask diagnose looks at approximate caches of diffusion models; an "
                                      "autoregressive model's cache is exact", decodes=decodes, **more)


@ROW_KINDS.register
class MaskedKind:
    name = "masked"
    Stats = MaskedStats
    diagnoses = True

    @classmethod
    def suits(cls, arch, drafter) -> bool:
        """Full-attention, block and causal models decoded alone."""
        return drafter is None and arch.kind in ("full", "block", "causal")

    @classmethod
    def takes(cls, arch, tokens) -> Takes:
        """Every input; text after a hole and templates as the model's attention allows."""
        if arch.kind == "causal":
            return causal_takes(arch, tokens)
        if arch.kind == "block":
            return Takes(suffix=suffix_refusal(arch, "a block-diffusion model attends to earlier blocks only"),
                         template=template_refusal(arch, "attends left to right (give one hole at the end of the "
                                                         "text)"))
        return Takes()

    @classmethod
    def accept(cls, params: GenerationParams, arch, given: frozenset | None, engine: bool) -> GenerationParams:
        """Its rows' parameters (see engine/accept.py). An autoregressive model: `accept_causal`. A
        block-diffusion model (config bd_size) runs blocks of bd_size positions: the rules of
        GenerationParams.check(block_size), and a cache that suits a block model. A full-attention
        model: GenerationParams.check() and a cache that suits it. A reference mode's family is
        checked before its settings; a renoising sampler's knobs are refused by name."""
        if arch.kind == "causal":
            return accept_causal(params, arch, given)
        if params.compat is not None:  # the mode's family before its settings
            get_mode(params.compat).check_family(arch.family)
        for name in RENOISE_KNOBS:
            if getattr(params, name) is not None:
                raise UnmaskError(f"{name} {getattr(params, name)} is a setting of a renoising model's sampler "
                                  f"(DiffusionGemma); this {arch.family} model is a masked diffusion model", param=name)
        if engine and params.compat is not None:
            raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
        p = params.check(arch.block_size)
        if p.compat is None:
            cache = CACHES.lookup(p.cache, UnmaskError)
            if arch.kind not in cache.suits:
                fits = ", ".join(n for n, c in CACHES.items() if arch.kind in c.suits)
                raise UnmaskError(f"cache {p.cache!r} {_SUITS_TEXT.get(cache.suits, 'does not suit this model')}; "
                                  f"{_KIND_TEXT[arch.kind]}: use {fits}")
        return p

    @classmethod
    def mask_token(cls, arch) -> str:
        """A diffusion model's canvas starts as its mask token; an autoregressive twin's placeholder
        may be any id it never writes."""
        return "placeholder" if arch.causal else "model"

    @classmethod
    def screen(cls, given: dict, arch) -> dict:
        """A named reference mode's family; the rest `accept` checks."""
        return check_compat_family(given, arch)

    def __init__(self, ctx: KindContext) -> None:
        model, tokens = ctx.model, ctx.tokens
        arch = self.arch = model.config
        self.model, self.tokens, self.device = model, tokens, ctx.device
        # hidden j scores token j + shift: Dream and the AR twin shift by one
        self.shift = 1 if arch.causal else arch.logit_shift
        self.align = arch.block_size  # a block-diffusion model: its attention blocks are the decoding blocks
        self.mask = tokens.mask
        self.rows = RowState(self.device, tokens.pad if tokens.pad is not None else tokens.eos,
                             mask_id=tokens.mask, stop_ids=torch.tensor(tokens.stop, device=self.device))
        self.settings: dict[tuple, int] = {}  # decoding setting -> id, while a running row uses it
        self.parts: dict = {}
        self.runner = ModelRunner(model, self.rows, self.shift)
        # a tensor-parallel model hands its vocabulary slice to the sampler (no gathered logits)
        self.committer = Committer(self.rows, self.parts, self.mask, ctx.draws, getattr(model, "tp", None),
                                   arch.vocab_size)
        self.constrained = Constrained(self.rows, self.mask, tokens.eos)  # structured output's rows
        # holes that grow and shrink (hole_length "grow": a model with DreamOn's expand token)
        self.growth = Growth(self.rows, tokens.expand, self.mask, getattr(model, "tp", None), arch.vocab_size)
        self.logprobs = Logprobs(self.rows)  # rows that report their tokens' log-probabilities
        # prompt K/V shared across requests, for the settings whose cache policy allows it (kv/prefix.py):
        # pages of the model's attention block (a block model), else 16 tokens
        self.prefix = PrefixStore(ctx.prefix_bytes, self.align or 16) if ctx.prefix_bytes else None
        self._setting_ids = itertools.count()
        self.watching = 0  # watched rows (their proposals cost one transfer per step)
        self.observer = None  # diagnostics (unmask.engine.diagnostics): sees every forward, changes none
        self._groups: list = []
        self._plan: Plan | None = None
        # the next step's (groups, plan) and its sizes with every row running, read with this
        # step's report; dropped when rows join or leave (their plans change)
        self._ahead: tuple | None = None
        self._sizes: list[int] | None = None

    def prepare(self, params):
        """What a request's rows decode with (engine/parts.py), built once when it is added."""
        return build_parts(params, self.tokens)

    # --- rows ------------------------------------------------------------------------------------
    def admit(self, reqs: list) -> None:
        for req in reqs:
            key = setting_key(req.params)
            if key not in self.settings:
                self.settings[key] = sid = next(self._setting_ids)
                self.parts[sid] = req.parts
            p = req.params
            width = p.block_length if self.align else max(p.steps_per_block, 1)  # the quota table
            self.rows.add(req, self.mask, self.settings[key], width, self.align)
            self._reuse(req)
            self.constrained.admit(req)
            self.growth.admit(req)
            self.watching += req.watch
        self.logprobs.admit(reqs)
        self._ahead = None

    def remove(self, gone: list[int]) -> None:
        self.watching -= sum(self.rows.reqs[i].watch for i in gone)
        for i in gone:
            self.constrained.remove(self.rows.reqs[i])
        self.growth.remove([self.rows.reqs[i] for i in gone])
        if self.prefix is not None:
            self.prefix.forget([self.rows.reqs[i] for i in gone])
        self.logprobs.remove([self.rows.reqs[i] for i in gone])
        self.rows.remove(gone)
        self._forget_settings()
        self._ahead = None

    def _reuse(self, req) -> None:
        """The joining row (the last) takes its prompt's cached prefix, if any; its own prompt's
        pages are shared once its first step has made them final (`_share`)."""
        if self.prefix is None:
            return
        m, slots = self.prefix.lookup(req, req.parts.cache.prefix(len(req.prompt), self.align, self.shift))
        if m:
            r, like = self.rows, self.prefix.pools["k"][0]
            layers = self.arch.num_layers
            self.prefix.load({"k": r.layer_buffers("k", layers, like), "v": r.layer_buffers("v", layers, like)},
                             r.n - 1, slots)
            r.reused[r.n - 1] = m

    def _share(self, report: Report) -> None:
        """Rows whose first step ran: their prompt's final K/V pages join the prefix cache."""
        r = self.rows
        for i in report.rows:
            if r.k is None:  # no K/V kept (no cache): nothing to share
                self.prefix.final(r.reqs[i])
            else:
                self.prefix.share(r.reqs[i], {"k": r.k, "v": r.v}, i)

    def _forget_settings(self) -> None:
        """Settings no running row uses are dropped, so a long-running server's tables stay small."""
        live = set(self.rows.distinct)
        for key, sid in list(self.settings.items()):
            if sid not in live:
                del self.settings[key], self.parts[sid]

    # --- one step --------------------------------------------------------------------------------
    def cost(self) -> Cost:
        r = self.rows
        if self._ahead is not None:  # planned at the end of the last step, its sizes read with its report
            (self._groups, self._plan), self._ahead = self._ahead, None
            return Cost(self._plan.cost, r.seq, self._plan.full, total=self._sizes[0])
        self._groups, self._plan = self._planned()
        self._sizes = None
        return Cost(self._plan.cost, r.seq, self._plan.full)

    def _planned(self) -> tuple[list, Plan]:
        """(setting's cache policy, its rows as an (n,) bool) for each setting that runs, and the
        merged plan of the policies for the rows as they are now."""
        r = self.rows
        groups = [(self.parts[cfg].cache, r.cfg == cfg) for cfg in r.distinct]
        return groups, self._merge([(rows, cache.plan(r, self.shift, self.align)) for cache, rows in groups])

    def decode(self, run: torch.Tensor | None) -> Report:
        groups = self._groups
        verifying = any(cache.verifies for cache, _ in groups)
        work = StepWork(self.rows, self._plan, run, verifying, self._sizes[1:] if run is None else None)
        was = self.growth.before()  # a growing hole's masks before the step's commits
        for f in work.window():
            self._run(work, f)
        if work.doubted():  # what the doubted rows recompute: their verifying caches' plans, merged
            work.recompute(self._merge([(rows, cache.recompute(self.rows, self.shift))
                                        for cache, rows in groups if cache.verifies]))
        for f in work.rest():
            self._run(work, f)
        for cache, rows in groups:  # each policy updates its own per-row counters
            cache.after(self.rows, rows & work.run, work.plan, work.redo, work.committed, self.align)
        settled = postprocess.settle(self.rows, work, None if was is None else self.growth.edit(was))
        ahead = self._planned()  # the next step's plan, if no row joins or leaves before it
        sizes = torch.cat([ahead[1].cost.sum()[None], shape(self.rows, ahead[1], None)])
        flat = torch.cat([settled, sizes]).tolist()  # the step's one read
        self._ahead, self._sizes = ahead, flat[settled.numel():]
        report = postprocess.report(self.rows, work, flat[:settled.numel()], self.committer.shown)
        self.committer.shown = {}
        self.logprobs.attach(report)
        if self.prefix is not None and self.prefix.waiting:
            self._share(report)
        return report

    def _run(self, work: StepWork, f: Forward) -> None:
        r, t0 = self.rows, time.perf_counter()
        fresh = self.runner.fresh(f.idx, r.s, work.W) if self.observer is not None else None  # before commits
        logits = self.growth.hold(f.idx, self.runner.forward(f, work.plan, r.s, work.W))
        lock = self.constrained.before(f.idx, logits, work.W)  # structured output: the frontier's mask
        if self.logprobs.count:  # the block's tokens before this forward's commits
            ar = torch.arange(work.W, device=r.device)[None, :]
            cols = torch.where(ar < (r.e - r.s)[f.idx, None], r.s[f.idx, None] + ar, r.cap)
            was = r.x[f.idx].gather(1, cols)
        done = self.committer.commit(f.idx, logits, r.s, work.W, f.verify, self.watching > 0, lock)
        self.constrained.after(f.idx)
        if self.logprobs.count:  # what this forward wrote (commits, edits, the grammar's replacements)
            now = r.x[f.idx].gather(1, cols)
            self.logprobs.record(f.idx, cols, logits, now, (done.commit | (now != was)) & (now != self.mask)
                                 & (cols < r.cap))
        if self.observer is not None:
            if self.committer.tp is not None:  # diagnostics compare whole distributions
                logits = self.committer.tp.gather_vocab(logits, self.arch.vocab_size)
            self.observer.observe(self, f.kind, f.idx, r.s, work.W, logits, fresh, done)
        work.record(f, done, time.perf_counter() - t0)

    @staticmethod
    def _merge(plans: list) -> Plan:
        plan = plans[0][1]
        for rows, other in plans[1:]:
            plan = plan.where(rows, other)
        return plan
