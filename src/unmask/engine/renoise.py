"""The renoising row kind (DiffusionGemma): rows whose canvas starts as random tokens and is
rewritten until it stops (docs/diffusion-gemma.md), stepped by the one engine (engine.py).

Every request is a row of batched tensors (its canvas, argmax canvas, self-conditioning logits,
step counter, stability history, sampler settings, and its rows of the encoder's KV cache,
unmask.kv.renoise); a request joins at the next step and leaves the step it finishes. One
step:
1. the engine admits waiting requests (continuous batching, at most `max_num_seqs` rows);
2. cost: the positions a row computes this step are its new tokens if it must encode (its
   prompt, or the canvas it just finished) plus its canvas; the engine's token budget picks the
   rows that run, oldest first (the first always runs);
3. encode: one batched encoder pass over the rows with new tokens (right-padded, each row at its
   own positions); each of them starts a canvas of uniform random tokens;
4. denoise: one batched denoiser pass over the running canvases, then DiffusionGemma's sampler
   as tensor code: temperature t_min + (t_max - t_min) * step / N, a categorical draw per
   position, entropy-bound acceptance, renoising, stable-and-confident stopping;
5. a row whose canvas stopped appends its argmax canvas to its answer: the committed text grows
   a canvas at a time (the stream sends it then; nothing inside a running canvas is final); the
   row finishes at an end-of-text id or once its answer reaches gen_length (cut there: at most
   gen_length tokens, where the reference returns whole canvases), else it encodes that canvas
   at its next step. Only the rows whose canvas stopped are reported (their forwards since the
   last report, and the canvas's tokens as one commit at its last forward).
Random draws: a request with a seed draws from its own generator, alone and in the reference's
order, so its output is what transformers' `generate` returns for that prompt alone after
`torch.manual_seed(seed)`; requests without one draw together from torch's global generator (engine/draws.py).
Each request's output depends on no other request (its own positions, its own cache rows).
"""

import time
from dataclasses import dataclass

import torch

from unmask.compat import get_mode
from unmask.engine.kind import ROW_KINDS, Cost, KindContext, Report, Stats, Takes, suffix_refusal, template_refusal
from unmask.engine.rows import Rows, per_row
from unmask.errors import UnmaskError
from unmask.kv.prefix import PrefixStore
from unmask.kv.renoise import RenoiseKV
from unmask.params import PARAM_FIELDS, RENOISE_COMPAT, RENOISE_KNOBS, GenerationParams
from unmask.sampler.logprobs import token_logprobs
from unmask.sampler.renoise import accept_mask, categorical_entropy
from unmask.sampler.stops import first_stop_index
from unmask.trace import ForwardRecord


@dataclass
class RenoiseStats(Stats):
    canvases: int = 0  # canvases the row finished (each joined its answer)


@dataclass
class RenoiseRows(Rows):
    """A renoising row's canvas, its sampler's state and settings."""

    start: torch.Tensor = per_row()  # encoder slots written (the canvas's first position)
    step_left: torch.Tensor = per_row()  # denoising steps left in this canvas
    nfe: torch.Tensor = per_row()  # denoiser forwards since the row last reported
    new_len: torch.Tensor = per_row()  # tokens it encodes next (its prompt, its finished canvas), or 0
    t_min: torch.Tensor = per_row(torch.float32)
    t_span: torch.Tensor = per_row(torch.float32)  # t_max - t_min
    max_denoising_steps: torch.Tensor = per_row()
    gamma: torch.Tensor = per_row(torch.float32)
    stability_threshold: torch.Tensor = per_row()
    confidence_threshold: torch.Tensor = per_row(torch.float32)
    has_sc: torch.Tensor = per_row(torch.bool)  # sc holds the row's last step
    canvas: torch.Tensor = per_row()  # (n, L) the running canvas
    argmax: torch.Tensor = per_row()  # (n, L) its argmax canvas
    cells: torch.Tensor = per_row(torch.int8)  # (n, L) the playground's cell states
    history: torch.Tensor = per_row(fill=-1)  # (n, kmax, L) the last argmax canvases, the newest last
    # (n, L, V) processed logits of the last step, in slots (a large tensor: joins and leaves move rows only)
    sc: torch.Tensor | None = per_row(torch.float32, slots=True)
    L: int = 0
    pending: list = None  # per row: the tokens it encodes next, or None
    answers: list = None  # per row: the finished canvases (its committed text and padding)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.canvas = torch.zeros(0, self.L, dtype=torch.long, device=self.device)
        self.argmax, self.cells = self.canvas.clone(), self.canvas.to(torch.int8)
        self.history = torch.zeros(0, 0, self.L, dtype=torch.long, device=self.device)
        self.pending, self.answers = [], []

    def remove(self, gone: list[int]) -> list[int]:
        perm = super().remove(gone)
        self.pending = [self.pending[i] for i in perm]
        self.answers = [self.answers[i] for i in perm]
        kmax = int(self.stability_threshold.max()) if perm else 0  # the history the rows still need
        self.history = self.history[:, self.history.shape[1] - kmax:] if kmax else self.history[:, :0]
        return perm


# what a renoising model's sampler reads (DiffusionGemma's generate: whole canvases, its own schedule);
# policy "entropy" and temperature 0 are what it runs, so they may be named too
RENOISE_FIELDS = ("gen_length", "seed", "gamma", "compat", *RENOISE_KNOBS)
_RENOISE_SAME = {"policy": "entropy", "temperature": 0.0}
_RENOISE_HINT = {"temperature": " (its temperature falls from t_max to t_min)",
                 "steps": " (use max_denoising_steps, per canvas)"}
_REFERENCE = GenerationParams()


def _refuse_masked_compat(compat, arch) -> None:
    """A reference mode other than its own reproduces a masked diffusion sampler: refused by name."""
    if compat not in (None, RENOISE_COMPAT):
        raise UnmaskError(f"compat {compat!r} reproduces a masked diffusion sampler; this {arch.family} model is a "
                          f"renoising model (its own sampler, or compat {RENOISE_COMPAT!r})", param="compat")


@ROW_KINDS.register
class RenoiseKind:
    name = "renoise"
    Stats = RenoiseStats
    diagnoses, observer = False, None

    @classmethod
    def suits(cls, arch, drafter) -> bool:
        """Renoising models (canvases of random tokens), decoded alone."""
        return drafter is None and arch.kind == "renoise"

    @classmethod
    def takes(cls, arch, tokens) -> Takes:
        """Prompts only: no text after a hole, no template, no structured output (the whole canvas
        is rewritten each step)."""
        return Takes("renoising", suffix=suffix_refusal(arch, "a renoising model decodes canvases after its prompt"),
                     template=template_refusal(arch, "decodes canvases after its prompt (give one hole at the end of "
                                                     "the text)"),
                     constraint="a renoising model rewrites its whole canvas each step; structured output is not "
                                "supported for renoising rows", fast=False, sampler=RENOISE_COMPAT,
                     diagnose="unmask diagnose looks at a masked model's approximate caches; a renoising model has "
                              "no commit-time observer")

    @classmethod
    def mask_token(cls, arch) -> None:
        """Canvases start as random tokens: no mask token."""
        return None

    @classmethod
    def screen(cls, given: dict, arch) -> dict:
        """Its sampler is the entropy bound (policy "entropy"); a masked sampler's reference mode and
        the fields its sampler would not use are refused by name."""
        _refuse_masked_compat(given.get("compat"), arch)
        cls.refuse_unused(given, arch)
        return {"policy": "entropy", **{k: v for k, v in given.items() if v is not None}}

    @classmethod
    def refuse_unused(cls, given: dict, arch) -> None:
        """An UnmaskError naming the fields its sampler would not use (None: not given)."""
        wrong = sorted(f for f, v in given.items() if v is not None and f not in RENOISE_FIELDS
                       and v != _RENOISE_SAME.get(f, object()))
        if wrong:
            shown = ", ".join(f"{f} {given[f]!r}" for f in wrong)
            raise UnmaskError(f"{shown}: not used by a renoising model{_RENOISE_HINT.get(wrong[0], '')}; this "
                              f"{arch.family} model rewrites whole canvases with its own sampler and takes "
                              f"{', '.join(RENOISE_FIELDS)}", param=wrong[0])

    @classmethod
    def accept(cls, params: GenerationParams, arch, given: frozenset | None, engine: bool) -> GenerationParams:
        """A renoising model (DiffusionGemma) runs its own sampler, natively (the engine) or as its
        reference's batch (compat diffusion-gemma): the same settings, checked by that mode, its
        defaults filled in; masked-diffusion settings (a policy, blocks, a cache...) are refused by
        name, given or not different from the reference setting."""
        _refuse_masked_compat(params.compat, arch)
        if given is None:  # what differs from the reference setting (a canvas-wide block is the canvas)
            given = frozenset(f for f in PARAM_FIELDS if getattr(params, f) != getattr(_REFERENCE, f)
                              and f not in ("gen_length", "steps")
                              and not (f == "block_length" and params.block_length == params.gen_length))
        cls.refuse_unused({f: getattr(params, f) for f in given}, arch)
        if engine and params.compat is not None:
            raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
        # its sampler's rules are its reference's; natively they refuse in the model's name
        subject = None if params.compat is not None else f"this renoising {arch.family} model does not take"
        return params.check(mode=get_mode(RENOISE_COMPAT), subject=subject)

    def __init__(self, ctx: KindContext) -> None:
        self.model, self.tokens, self.device, self.draws = ctx.model, ctx.tokens, ctx.device, ctx.draws
        arch = ctx.model.config
        self.L, self.V = arch.canvas_length, arch.vocab_size
        self.pad = self.tokens.pad if self.tokens.pad is not None else self.tokens.eos
        self.stop = set(self.tokens.stop)
        self.rows = RenoiseRows(self.device, self.pad, L=self.L)
        self.kv = RenoiseKV(arch.layout.sliding, arch.layout.window, 0, self.device)
        self.watching = 0
        # prompt K/V shared across requests (kv/prefix.py): the encoder's, causal, in pages of 16
        # tokens, every layer whole (a sliding layer holds only its window of a reused prefix)
        self.prefix = PrefixStore(ctx.prefix_bytes, 16) if ctx.prefix_bytes else None

    def prepare(self, params) -> None:
        return None

    # --- rows --------------------------------------------------------------------------------------
    def admit(self, reqs: list) -> None:
        r, n = self.rows, len(reqs)
        p = [q.params for q in reqs]
        kmax = max([x.stability_threshold for x in p] + [r.history.shape[1]])
        grow = kmax - r.history.shape[1]
        if grow > 0:  # a longer history for a new row's larger threshold: older entries (never matched) in front
            r.history = torch.cat([r.history.new_full((r.n, grow, self.L), -1), r.history], 1)
        r.append(reqs, {
            "t_min": [x.t_min for x in p],
            "t_span": [x.t_max - x.t_min for x in p],  # float32 of the float64 difference
            "max_denoising_steps": [x.max_denoising_steps for x in p], "gamma": [x.gamma for x in p],
            "stability_threshold": [x.stability_threshold for x in p],
            "confidence_threshold": [x.confidence_threshold for x in p],
            "new_len": [len(q.prompt) for q in reqs]})
        r.pending += [torch.tensor(q.prompt, dtype=torch.long, device=self.device) for q in reqs]
        r.answers += [[] for _ in reqs]
        self.kv.add_rows(n)
        if self.prefix is not None:
            self._reuse(reqs, r.n - n)
        self.watching += sum(q.watch for q in reqs)

    def _reuse(self, reqs: list, first: int) -> None:
        """Joining rows (from row `first`) take their prompts' cached prefixes: the encoder's
        slots of [0, m), so they encode [m, P) only (at least the last prompt token, whose pass
        starts the first canvas)."""
        r, store, lay = self.rows, self.prefix, self.model.config.layout
        for j, q in enumerate(reqs, first):
            m, slots = store.lookup(q, len(q.prompt) - 1)
            if not m:
                continue
            got = store.gather(slots)
            self.kv.put(torch.tensor([j], device=self.device),
                        RenoiseKV.holding(lay.sliding, lay.window, got["k"], got["v"], m, self.device))
            r.start[j], r.new_len[j] = m, len(q.prompt) - m
            r.pending[j] = r.pending[j][m:]

    def remove(self, gone: list[int]) -> None:
        if self.prefix is not None:
            self.prefix.forget([self.rows.reqs[i] for i in gone])
        self.watching -= sum(self.rows.reqs[i].watch for i in gone)
        perm = self.rows.remove(gone)
        self.kv.keep(torch.tensor(perm, dtype=torch.long, device=self.device))

    # --- one step --------------------------------------------------------------------------------
    def cost(self) -> Cost:
        return Cost(self.rows.new_len + self.L, self.rows.seq)

    def decode(self, run: torch.Tensor) -> Report:
        report = Report()
        enc_rows = (run & (self.rows.new_len > 0)).nonzero().squeeze(-1)
        if enc_rows.numel():
            report.records.append(self._encode(enc_rows))
        ended = self._denoise(run.nonzero().squeeze(-1), report)
        self._report(ended, report)
        return report

    def _encode(self, rows: torch.Tensor) -> ForwardRecord:
        """One encoder pass over `rows`' new tokens; each then starts a canvas."""
        t0, r = time.perf_counter(), self.rows
        idx = rows.tolist()
        new = torch.nn.utils.rnn.pad_sequence([r.pending[i] for i in idx], batch_first=True, padding_value=self.pad)
        n = r.new_len[rows]
        held = torch.arange(new.shape[1], device=self.device)[None] < n[:, None]
        positions = r.start[rows][:, None] + torch.arange(new.shape[1], device=self.device)[None]
        kv = self.kv.select(rows)
        sharing = [self.prefix.final(r.reqs[i]) for i in idx] if self.prefix is not None and self.prefix.waiting else []
        with kv.writing(positions, held, held, record=any(sharing)):
            self.model.encode(new, positions, kv)
        self.kv.put(rows, kv)
        for b, (i, share) in enumerate(zip(idx, sharing)):  # prompts just encoded: their pages join the cache
            if share is not None:
                layers = range(len(kv.recorded))
                self.prefix.insert(r.reqs[i].prompt, share[0], {"k": [kv.recorded[j][0] for j in layers],
                                                                "v": [kv.recorded[j][1] for j in layers]}, b, share[1])
        kv.recorded = None
        r.start[rows] += n
        r.new_len[rows] = 0
        for i in idx:
            r.pending[i] = None
        # a fresh canvas: the reference's randint (B, L), per seeded row from its own generator
        r.canvas[rows] = self._randint(rows)
        r.argmax[rows] = r.canvas[rows]
        r.has_sc[rows] = False
        r.step_left[rows] = r.max_denoising_steps[rows]
        r.history[rows] = -1
        return ForwardRecord(kind="encode", rows=len(idx), positions=float(n.float().mean()), committed=0,
                             seconds=time.perf_counter() - t0)

    def _denoise(self, rows: torch.Tensor, report: Report) -> torch.Tensor:
        """One denoising step of `rows`' canvases; returns the (n,) rows whose canvas stopped."""
        t0, r = time.perf_counter(), self.rows
        everyone = rows.numel() == r.n
        kv = self.kv if everyone else self.kv.select(rows)
        positions = r.start[rows][:, None] + torch.arange(self.L, device=self.device)[None]
        sc = None if r.sc is None or not bool(r.has_sc[rows].any()) else r.sc[rows]
        logits = self.model.denoise(r.canvas[rows], positions, kv, sc, r.has_sc[rows])
        steps = r.max_denoising_steps[rows]
        frac = r.step_left[rows].to(torch.int32) / steps.to(torch.int32)
        temp = r.t_min[rows] + r.t_span[rows] * frac  # float32, as the reference's logits processor
        processed = logits / temp[:, None, None]
        probs = torch.softmax(processed, dim=-1, dtype=torch.float32)
        sample = self._multinomial(rows, probs)
        new_argmax = processed.argmax(-1)
        entropy = categorical_entropy(processed)
        accepted = accept_mask(entropy, r.gamma[rows][:, None])
        noise = self._randint(rows)
        r.canvas[rows] = torch.where(accepted, sample, noise)
        # the playground's cell states: 2 stable (argmax unchanged), 1 accepted, 0 renoised
        r.cells[rows] = torch.where(new_argmax == r.argmax[rows], 2, accepted.to(torch.int8)).to(torch.int8)
        r.argmax[rows] = new_argmax
        stable = self._stable(rows, new_argmax, r.stability_threshold[rows])
        confident = entropy.mean(-1) < r.confidence_threshold[rows]
        r.allocate("sc", (self.L, self.V), processed.dtype)[rows] = processed
        r.has_sc[rows] = True
        r.step_left[rows] -= 1
        r.nfe[rows] += 1
        ended = torch.zeros(r.n, dtype=torch.bool, device=self.device)
        ended[rows] = (stable & confident) | (r.step_left[rows] == 0)
        report.records.append(ForwardRecord(kind="full", rows=rows.numel(), positions=float(self.L), committed=0,
                                            seconds=time.perf_counter() - t0))
        return ended

    def _stable(self, rows, argmax, k) -> torch.Tensor:
        """The argmax canvas equals each of the row's last k (its stability_threshold) ones."""
        r = self.rows
        kmax = r.history.shape[1]
        if not kmax:
            return torch.ones(rows.numel(), dtype=torch.bool, device=self.device)
        h = r.history[rows]  # (r, kmax, L), the newest last
        same = (h == argmax[:, None]).all(-1)  # (r, kmax)
        window = torch.arange(kmax, device=self.device)[None, :] >= kmax - k[:, None]
        stable = (same | ~window).all(1)
        r.history[rows] = torch.cat([h[:, 1:], argmax[:, None]], 1)
        return stable

    def _multinomial(self, rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """One categorical draw per position (the reference's torch.multinomial over (B*L, V))."""
        return self.draws.draw(
            rows.numel(), self.draws.seeded(self.rows.reqs, rows),
            lambda sel: torch.multinomial((probs if sel is None else probs[sel]).view(-1, self.V), 1).view(-1, self.L),
            lambda k, g: torch.multinomial(probs[k], 1, generator=g).view(self.L))

    def _randint(self, rows: torch.Tensor) -> torch.Tensor:
        dev = self.device
        return self.draws.draw(
            rows.numel(), self.draws.seeded(self.rows.reqs, rows),
            lambda sel: torch.randint(0, self.V, (rows.numel() if sel is None else sel.numel(), self.L), device=dev),
            lambda k, g: torch.randint(0, self.V, (1, self.L), generator=g, device=g.device)[0])

    def _logprobs(self, i: int, m: int, top: int) -> list:
        """Row i's first m tokens of its stopped canvas, scored under the sampler's distribution at
        its last step (the processed logits it keeps for self-conditioning)."""
        lp, ids, tlp = token_logprobs(self.rows.sc[i, :m], self.rows.argmax[i, :m], top)
        tops = torch.stack([ids.float(), tlp], -1).tolist() if top else [[] for _ in range(m)]
        return [(v, [(int(t), p) for t, p in tt]) for v, tt in zip(lp.tolist(), tops)]

    def _report(self, ended: torch.Tensor, report: Report) -> None:
        """Canvases that stopped join their answers (host work once per finished canvas, not per
        step); the rows whose answer is complete are done; watched rows show their canvas."""
        r = self.rows
        for i in ended.nonzero().squeeze(-1).tolist():
            req, ids = r.reqs[i], r.argmax[i].tolist()
            cut = first_stop_index(ids, self.stop)
            before = len(_text(r.answers[i], self.stop))
            n = int(r.nfe[i])
            kept = len(ids) if cut is None else cut + 1
            if cut is not None:
                ids = ids[: cut + 1] + [self.pad] * (len(ids) - cut - 1)
            r.answers[i] = (r.answers[i] + ids)[: req.params.gen_length]  # at most gen_length tokens
            finished = cut is not None or len(r.answers[i]) >= req.params.gen_length
            committed = _text(r.answers[i], self.stop)
            report.row(i, len(committed), committed[before:], n, [0] * (n - 1) + [kept], finished, RenoiseStats(1))
            if req.logprobs is not None:
                report.logprobs[i] = self._logprobs(i, len(committed) - before, req.logprobs)
            r.nfe[i] = 0
            if req.watch:
                report.views[i] = (r.answers[i], ["committed"] * len(r.answers[i]), None)
            if finished:
                report.answers[i] = r.answers[i]
            else:
                r.pending[i] = r.argmax[i].clone()
                r.new_len[i] = self.L
        if self.watching:  # watched rows whose canvas runs on: the provisional canvas (not final)
            names = ("renoised", "accepted", "stable")
            for i, req in enumerate(r.reqs):
                if req.watch and i not in report.views:
                    done = ["committed"] * len(r.answers[i])
                    report.views[i] = (r.answers[i] + r.argmax[i].tolist(), done + [names[c] for c in r.cells[i].tolist()],
                                       None)


def _text(answer: list[int], stop: set) -> list[int]:
    """The committed answer: up to (not including) the first end-of-text id."""
    cut = first_stop_index(answer, stop)
    return answer if cut is None else answer[:cut]
