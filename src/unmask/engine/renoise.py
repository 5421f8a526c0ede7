"""The request engine for renoising models (DiffusionGemma): `add_request` / `step` / `abort`, the
same surface as unmask.engine.Engine, for rows whose canvas starts as random tokens and is
rewritten until it stops (docs/diffusion-gemma.md).

Every request is a row of batched tensors (its canvas, argmax canvas, self-conditioning logits,
step counter, stability history, sampler settings, and its rows of the encoder's KV cache,
unmask.cache.renoise_kv); a request joins at the next step and leaves the step it finishes. One
step:
1. admit waiting requests (continuous batching, at most `max_num_seqs` rows);
2. budget: the positions a row computes this step are its new tokens if it must encode (its
   prompt, or the canvas it just finished) plus its canvas; rows run oldest first while the sum
   fits `max_num_batched_tokens` (the first always runs);
3. encode: one batched encoder pass over the rows with new tokens (right-padded, each row at its
   own positions); each of them starts a canvas of uniform random tokens;
4. denoise: one batched denoiser pass over the running canvases, then DiffusionGemma's sampler
   as tensor code: temperature t_min + (t_max - t_min) * step / N, a categorical draw per
   position, entropy-bound acceptance, renoising, stable-and-confident stopping;
5. a row whose canvas stopped appends its argmax canvas to its answer: the committed text grows
   a canvas at a time (the stream sends it then; nothing inside a running canvas is final); the
   row finishes at an end-of-text id or once its answer reaches gen_length (cut there: at most
   gen_length tokens, where the reference returns whole canvases), else it encodes that canvas
   at its next step.
Random draws: a request with a seed draws from its own generator, alone and in the reference's
order, so its output is what transformers' `generate` returns for that prompt alone after
`torch.manual_seed(seed)`; requests without one draw together from torch's global generator.
Each request's output depends on no other request (its own positions, its own cache rows).
"""

import time
from collections import deque

import torch

from unmask.cache.renoise_kv import RenoiseKV
from unmask.engine.front import RequestFront
from unmask.engine.request import EngineConfig, Request, Status, StepOutput
from unmask.models.base import TokenIds
from unmask.params import GenerationParams
from unmask.sampler.renoise import accept_mask, categorical_entropy
from unmask.trace import ForwardRecord

_SETTINGS = ("t_min", "t_span", "max_denoising_steps", "gamma", "stability_threshold", "confidence_threshold")


class RenoiseEngine(RequestFront):
    def __init__(self, model, tokens: TokenIds, config: EngineConfig | None = None) -> None:
        super().__init__(model.config, next(model.parameters()).device, config)
        self.model, self.tokens = model, tokens
        self.L, self.V = self.arch.canvas_length, self.arch.vocab_size
        self.stop_ids = torch.tensor(tokens.stop, device=self.device)
        self.pad = tokens.pad if tokens.pad is not None else tokens.eos
        self.trace: deque[ForwardRecord] = deque(maxlen=self.config.trace_limit)
        lay = self.arch.layout
        self.kv = RenoiseKV(lay.sliding, lay.window, 0, self.device)
        self.reqs: list[Request] = []
        self.pending: list[torch.Tensor | None] = []  # per row: the tokens it encodes next, or None
        self.answers: list[list[int]] = []  # per row: the finished canvases (its committed text and padding)
        z = lambda dtype: torch.zeros(0, dtype=dtype, device=self.device)  # noqa: E731
        self.start, self.step_left, self.nfe = z(torch.long), z(torch.long), z(torch.long)
        self.new_len = z(torch.long)  # per row: tokens it encodes next (its prompt, its finished canvas), or 0
        self.canvas_nfe = z(torch.long)
        self.set = {name: z(torch.float32 if name in ("t_min", "t_span", "gamma", "confidence_threshold")
                            else torch.long) for name in _SETTINGS}
        self.canvas = torch.zeros(0, self.L, dtype=torch.long, device=self.device)
        self.argmax = self.canvas.clone()
        self.cells = torch.zeros(0, self.L, dtype=torch.int8, device=self.device)
        self.sc: torch.Tensor | None = None  # (n, L, V) processed logits of each row's last step
        self.has_sc = z(torch.bool)
        self.history = torch.zeros(0, 0, self.L, dtype=torch.long, device=self.device)

    # --- requests (as Engine) --------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False) -> Request:
        return self._new_request(prompt, params, request_id, watch, None)

    def _drop_row(self, req: Request) -> None:
        i = self.reqs.index(req)
        self._keep(torch.tensor([j for j in range(len(self.reqs)) if j != i], dtype=torch.long, device=self.device))

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.reqs)

    @property
    def num_running(self) -> int:
        return len(self.reqs)

    # --- one step --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        self._admit()
        if not self.reqs:
            return []
        encode = self.new_len > 0
        cost = self.new_len + self.L
        run = torch.cumsum(cost, 0) <= self.config.max_num_batched_tokens
        run[0] = True
        enc_rows = (run & encode).nonzero().squeeze(-1)
        if enc_rows.numel():
            self._encode(enc_rows)
        den_rows = run.nonzero().squeeze(-1)
        ended = self._denoise(den_rows)
        return self._after(ended)

    def _encode(self, rows: torch.Tensor) -> None:
        """One encoder pass over `rows`' new tokens; each then starts a canvas."""
        t0 = time.perf_counter()
        idx = rows.tolist()
        new = torch.nn.utils.rnn.pad_sequence([self.pending[i] for i in idx], batch_first=True,
                                              padding_value=self.pad)
        n = torch.tensor([len(self.pending[i]) for i in idx], device=self.device)
        held = torch.arange(new.shape[1], device=self.device)[None] < n[:, None]
        positions = self.start[rows][:, None] + torch.arange(new.shape[1], device=self.device)[None]
        kv = self.kv.select(rows)
        with kv.writing(positions, held, held):
            self.model.encode(new, positions, kv)
        self.kv.put(rows, kv)
        self.start[rows] += n
        self.new_len[rows] = 0
        for i in idx:
            self.pending[i] = None
        # a fresh canvas: the reference's randint (B, L), per seeded row from its own generator
        self.canvas[rows] = self._randint(rows)
        self.argmax[rows] = self.canvas[rows]
        self.has_sc[rows] = False
        self.step_left[rows] = self.set["max_denoising_steps"][rows]
        self.canvas_nfe[rows] = 0
        if self.history.shape[0]:
            self.history[:, rows] = -1
        self.trace.append(ForwardRecord(kind="encode", rows=len(idx), positions=float(n.float().mean()),
                                        committed=0, seconds=time.perf_counter() - t0))

    def _denoise(self, rows: torch.Tensor) -> torch.Tensor:
        """One denoising step of `rows`' canvases; returns the (n,) rows whose canvas stopped."""
        t0 = time.perf_counter()
        everyone = rows.numel() == len(self.reqs)
        kv = self.kv if everyone else self.kv.select(rows)
        positions = self.start[rows][:, None] + torch.arange(self.L, device=self.device)[None]
        sc = None if self.sc is None or not bool(self.has_sc[rows].any()) else self.sc[rows]
        logits = self.model.denoise(self.canvas[rows], positions, kv, sc, self.has_sc[rows])
        s = {k: v[rows] for k, v in self.set.items()}
        frac = self.step_left[rows].to(torch.int32) / s["max_denoising_steps"].to(torch.int32)
        temp = s["t_min"] + s["t_span"] * frac  # float32, as the reference's logits processor
        processed = logits / temp[:, None, None]
        probs = torch.softmax(processed, dim=-1, dtype=torch.float32)
        sample = self._multinomial(rows, probs)
        new_argmax = processed.argmax(-1)
        entropy = categorical_entropy(processed)
        accepted = accept_mask(entropy, s["gamma"][:, None])
        noise = self._randint(rows)
        self.canvas[rows] = torch.where(accepted, sample, noise)
        # the playground's cell states: 2 stable (argmax unchanged), 1 accepted, 0 renoised
        self.cells[rows] = torch.where(new_argmax == self.argmax[rows], 2, accepted.to(torch.int8)).to(torch.int8)
        self.argmax[rows] = new_argmax
        stable = self._stable(rows, new_argmax, s["stability_threshold"])
        confident = entropy.mean(-1) < s["confidence_threshold"]
        if self.sc is None:
            self.sc = processed.new_zeros(len(self.reqs), self.L, self.V)
        self.sc[rows] = processed
        self.has_sc[rows] = True
        self.step_left[rows] -= 1
        self.nfe[rows] += 1
        self.canvas_nfe[rows] += 1
        ended = torch.zeros(len(self.reqs), dtype=torch.bool, device=self.device)
        ended[rows] = (stable & confident) | (self.step_left[rows] == 0)
        self.trace.append(ForwardRecord(kind="full", rows=rows.numel(), positions=float(self.L), committed=0,
                                        seconds=time.perf_counter() - t0))
        return ended

    def _stable(self, rows, argmax, k) -> torch.Tensor:
        """The argmax canvas equals each of the row's last k (its stability_threshold) ones."""
        if not self.history.shape[0]:
            return torch.ones(rows.numel(), dtype=torch.bool, device=self.device)
        h = self.history[:, rows]  # (kmax, r, L), the newest last
        kmax = h.shape[0]
        counts = (h == argmax[None]).all(-1)  # (kmax, r)
        window = torch.arange(kmax, device=self.device)[:, None] >= kmax - k[None, :]
        stable = (counts | ~window).all(0)
        self.history[:, rows] = torch.cat([h[1:], argmax[None]], 0)
        return stable

    def _multinomial(self, rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """One categorical draw per position (the reference's torch.multinomial over (B*L, V))."""
        seeded = [(i, self.generators.get(self.reqs[r].id)) for i, r in enumerate(rows.tolist())]
        out = torch.empty(probs.shape[:2], dtype=torch.long, device=self.device)
        shared = [i for i, g in seeded if g is None]
        if shared:
            out[shared] = torch.multinomial(probs[shared].view(-1, self.V), 1).view(len(shared), self.L)
        for i, g in seeded:  # a seeded request draws alone, from its own generator
            if g is not None:
                out[i] = torch.multinomial(probs[i], 1, generator=g).view(self.L)
        return out

    def _randint(self, rows: torch.Tensor) -> torch.Tensor:
        seeded = [(i, self.generators.get(self.reqs[r].id)) for i, r in enumerate(rows.tolist())]
        out = torch.empty(rows.numel(), self.L, dtype=torch.long, device=self.device)
        shared = [i for i, g in seeded if g is None]
        if shared:
            out[shared] = torch.randint(0, self.V, (len(shared), self.L), device=self.device)
        for i, g in seeded:
            if g is not None:
                out[i] = torch.randint(0, self.V, (1, self.L), generator=g, device=g.device).to(self.device)[0]
        return out

    def _after(self, ended: torch.Tensor) -> list[StepOutput]:
        """Canvases that stopped join their answers; finished rows leave; outputs."""
        outputs, gone = [], []
        stop = set(self.tokens.stop)
        for i in ended.nonzero().squeeze(-1).tolist():  # host work once per finished canvas, not per step
            req, ids = self.reqs[i], self.argmax[i].tolist()
            cut = next((j for j, t in enumerate(ids) if t in stop), None)
            before = len(_text(self.answers[i], stop))
            n = int(self.canvas_nfe[i])
            kept = len(ids) if cut is None else cut + 1
            req.commits.extend([0] * (n - 1) + [kept])
            if cut is not None:
                ids = ids[: cut + 1] + [self.pad] * (len(ids) - cut - 1)
            self.answers[i] = (self.answers[i] + ids)[: req.params.gen_length]  # at most gen_length tokens
            req.nfe = int(self.nfe[i])
            if req.first_commit is None:
                req.first_commit = time.perf_counter()
            finished = cut is not None or len(self.answers[i]) >= req.params.gen_length
            committed = _text(self.answers[i], stop)
            req.committed = len(committed)
            outputs.append(StepOutput(req, len(committed), committed[before:], finished,
                                      *(self._watched(i, final=True) if req.watch else (None, None))))
            if finished:
                gone.append(i)
                self._finish(req, Status.FINISHED, "stop" if cut is not None else "length", self.answers[i])
            else:
                self.pending[i] = self.argmax[i].clone()
                self.new_len[i] = self.L
        for i in (j for j, req in enumerate(self.reqs) if req.watch):  # watched rows: the provisional canvas
            req = self.reqs[i]
            if not bool(ended[i]):
                outputs.append(StepOutput(req, req.committed, [], False, *self._watched(i)))
        if gone:
            self._keep(torch.tensor([j for j in range(len(self.reqs)) if j not in set(gone)], dtype=torch.long,
                                    device=self.device))
        return outputs

    def _watched(self, i: int, final: bool = False) -> tuple[list[int], list[str]]:
        """A watched row's answer so far and its provisional argmax canvas (not final), with each
        position's state; `final`: the canvas just joined the answer."""
        done = ["committed"] * len(self.answers[i])
        if final:
            return self.answers[i], done
        names = ("renoised", "accepted", "stable")
        return self.answers[i] + self.argmax[i].tolist(), done + [names[c] for c in self.cells[i].tolist()]

    # --- rows --------------------------------------------------------------------------------------
    def _admit(self) -> None:
        new = self.scheduler.admit(len(self.reqs))
        if not new:
            return
        t = lambda vals, dtype: torch.tensor(vals, dtype=dtype, device=self.device)  # noqa: E731
        n = len(new)
        for req in new:
            req.status, req.started = Status.RUNNING, time.perf_counter()
            self.reqs.append(req)
            self.pending.append(torch.tensor(req.prompt, dtype=torch.long, device=self.device))
            self.answers.append([])
        p = [q.params for q in new]
        add = {"t_min": t([x.t_min for x in p], torch.float32),
               "t_span": t([x.t_max - x.t_min for x in p], torch.float32),  # float32 of the float64 difference
               "max_denoising_steps": t([x.max_denoising_steps for x in p], torch.long),
               "gamma": t([x.gamma for x in p], torch.float32),
               "stability_threshold": t([x.stability_threshold for x in p], torch.long),
               "confidence_threshold": t([x.confidence_threshold for x in p], torch.float32)}
        for k, v in add.items():
            self.set[k] = torch.cat([self.set[k], v])
        zeros = torch.zeros(n, dtype=torch.long, device=self.device)
        self.start, self.step_left = torch.cat([self.start, zeros]), torch.cat([self.step_left, zeros])
        self.new_len = torch.cat([self.new_len, t([len(q.prompt) for q in new], torch.long)])
        self.nfe, self.canvas_nfe = torch.cat([self.nfe, zeros]), torch.cat([self.canvas_nfe, zeros])
        self.has_sc = torch.cat([self.has_sc, zeros.bool()])
        self.canvas = torch.cat([self.canvas, self.canvas.new_zeros(n, self.L)])
        self.argmax = torch.cat([self.argmax, self.argmax.new_zeros(n, self.L)])
        self.cells = torch.cat([self.cells, self.cells.new_zeros(n, self.L)])
        if self.sc is not None:
            self.sc = torch.cat([self.sc, self.sc.new_zeros(n, self.L, self.V)])
        kmax = max(int(self.set["stability_threshold"].max()), 0)
        grow = kmax - self.history.shape[0]
        # a longer history for a new row's larger threshold: older entries (never matched) in front
        self.history = torch.cat([self.history.new_full((max(grow, 0), *self.history.shape[1:]), -1), self.history])
        self.history = torch.cat([self.history, self.history.new_full((self.history.shape[0], n, self.L), -1)], 1)
        self.kv.add_rows(n)

    def _keep(self, rows: torch.Tensor) -> None:
        idx = rows.tolist()
        self.reqs = [self.reqs[i] for i in idx]
        self.pending = [self.pending[i] for i in idx]
        self.answers = [self.answers[i] for i in idx]
        for name in ("start", "step_left", "nfe", "canvas_nfe", "new_len", "has_sc", "canvas", "argmax", "cells"):
            setattr(self, name, getattr(self, name)[rows])
        self.set = {k: v[rows] for k, v in self.set.items()}
        self.sc = None if self.sc is None or not idx else self.sc[rows]
        self.history = self.history[:, rows]
        kmax = int(self.set["stability_threshold"].max()) if idx else 0
        self.history = self.history[self.history.shape[0] - kmax:] if kmax else self.history[:0]
        self.kv.keep(rows)


def _text(answer: list[int], stop: set) -> list[int]:
    """The committed answer: up to (not including) the first end-of-text id."""
    cut = next((j for j, t in enumerate(answer) if t in stop), None)
    return answer if cut is None else answer[:cut]
