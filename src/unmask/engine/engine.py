"""The request-level engine: `add_request`, `step`, `abort` (the shape of nano-vllm / vLLM).

Every request has its own canvas, block position, step counter, schedule, KV rows, parameters
and random generator; the running requests live as rows of batched tensors, so a step is tensor
code over all rows, whatever block each row is in. A request joins the running batch at the next
step (continuous batching) and leaves it the step it finishes or is aborted, freeing its rows.

One engine step:
1. Admit waiting requests while fewer than `max_num_seqs` run (first come, first served).
2. Plan each running row with its cache policy: a *full* forward (no cache, or a cache refresh:
   the whole canvas) or a *window* forward (a cached step: the block, or block and suffix).
3. Spend the token budget (`max_num_batched_tokens`, positions computed per step): window rows
   first (a cached step costs its window, O(block)), then full rows (O(canvas)), oldest first;
   the first row always runs. A long refresh therefore never delays short cached steps beyond
   the forward they share; what does not fit waits for the next step (measured in `unmask bench serve`).
   An adaptive-cache row that doubts its cached step (refresh_below) is recomputed in the same
   step; that recomputation is not counted against the budget (the row was admitted with its window).
4. One forward for the full rows (right-padded canvases, padding masked out of attention) and one
   for the window rows (each row's own window and its own KV rows, aligned by a per-row start).
5. Proposals and commits per distinct setting among the rows (a few groups, not one per row),
   then per-row bookkeeping in tensors: blocks advance, finished rows leave.

Greedy output of a request does not depend on what else runs: padding is masked, positions are
each row's own, and each request samples from its own generator. A block-diffusion model (config
bd_size) runs here too, with another plan from its cache policy (`exact`): its blocks are fixed by
position, the first forward is a prefill of the prompt and first block, each later step computes
the open block, and the step after a block fills also recomputes that block to write its final
K/V (the commit forward, fused with the next block's first step). An autoregressive model (the
AR twin) runs as a model with blocks of one token and an exact KV cache: one prefill forward,
then one cached window per token. Compat modes are not served here (LLM.generate runs
them as their own lockstep batch, as the references do).
"""

import itertools
import time
from dataclasses import dataclass, field, replace
from enum import Enum

import torch

from unmask.cache.policy import CACHES
from unmask.engine.parts import DecodeParts, build_parts
from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.proposal import propose


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64  # requests decoded together
    max_num_batched_tokens: int = 16384  # positions computed per step, over all rows
    max_waiting: int = 4096  # queued requests beyond which add_request refuses
    # "continuous": a request joins at the next step. "static" (the baseline that the load
    # benchmark compares with): a batch is admitted only when the running one has drained, once
    # max_num_seqs requests wait or the oldest has waited static_wait seconds
    scheduling: str = "continuous"
    static_wait: float = 0.05

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UnmaskError(f"{name} {v!r} must be a positive integer")
        if self.scheduling not in ("continuous", "static"):
            raise UnmaskError(f"scheduling {self.scheduling!r} must be continuous or static")
        if not (isinstance(self.static_wait, (int, float)) and 0 <= self.static_wait < 3600):
            raise UnmaskError(f"static_wait {self.static_wait!r} must be seconds in [0, 3600)")


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class Request:
    id: str
    prompt: list[int]
    params: GenerationParams
    parts: DecodeParts
    arrival: float
    status: Status = Status.WAITING
    nfe: int = 0
    commit_forwards: int = 0  # of its forwards, those that wrote a finished block's exact K/V (block models)
    commits: list[int] = field(default_factory=list)  # tokens committed at each of its forwards
    committed: int = 0  # contiguous committed tokens from the start of the answer
    canvas: list[int] | None = None  # the generated region when finished (MASK where never committed)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    started: float | None = None  # first forward
    first_commit: float | None = None  # first step that grew the committed prefix
    finished: float | None = None
    watch: bool = False  # report the whole canvas and this step's proposals (the playground)
    proposal: dict[int, int] = field(default_factory=dict)  # answer position -> proposed token, last step

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)


@dataclass
class StepOutput:
    """What one step changed for one request."""

    request: Request
    committed: int  # contiguous committed prefix after this step
    new_ids: list[int]  # the ids that extended the committed prefix in this step
    finished: bool
    canvas: list[int] | None = None  # watched requests: the answer region after this step (MASK = open)


@dataclass
class ForwardRecord:
    """One batched forward of a step (a step runs at most two: full rows and window rows)."""

    # "full" (no cache, a cache refresh, or a block model's prefill) | "window" (a cached step) |
    # "commit" (a cached step in which `commit_rows` rows also write the final K/V of the block
    # they just finished: a block model's commit forward, fused with the next block's first step)
    kind: str
    rows: int
    positions: float  # positions computed per row (mean over the rows)
    committed: int  # tokens committed over all rows
    seconds: float = 0.0
    commit_rows: int = 0

    @property
    def refresh(self) -> bool:
        return self.kind == "full"

    @property
    def cached(self) -> bool:
        return self.kind != "full"


class _Rows:
    """The running requests as rows of batched tensors. Canvases are right-padded to a capacity
    `cap`; column `cap` is a scratch column that padded entries write to, so scatters never
    collide with real columns."""

    def __init__(self, device: torch.device, pad_id: int) -> None:
        self.device, self.pad_id = device, pad_id
        self.reqs: list[Request] = []
        self.settings: list[int] = []  # each row's setting id, host-side (no read-back to find them)
        self.cap = 0
        z = lambda: torch.zeros(0, dtype=torch.long, device=device)  # noqa: E731
        self.x = torch.zeros(0, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(0, 1, dtype=torch.long, device=device)
        self.L, self.P, self.blk, self.spb, self.tps = z(), z(), z(), z(), z()
        self.s, self.e, self.kvx = z(), z(), z()  # the open block [s, e); K/V exact before column kvx
        self.block, self.step, self.cfg = z(), z(), z()
        self.since = z()  # tokens committed since the row's last full forward (the adaptive cache's trigger)
        self.cached = torch.zeros(0, dtype=torch.bool, device=device)  # the row's cache policy keeps KV
        self.exact = torch.zeros(0, dtype=torch.bool, device=device)  # ... exact K/V of finished blocks
        self.early = torch.zeros(0, dtype=torch.bool, device=device)  # the row stops at its end of text
        self.quota = torch.zeros(0, 1, dtype=torch.long, device=device)
        self.k: list[torch.Tensor] | None = None  # per layer (N, H_kv, cap + 1, D)
        self.v: list[torch.Tensor] | None = None

    @property
    def n(self) -> int:
        return len(self.reqs)

    def _grow(self, cap: int) -> None:
        extra = cap - self.cap
        pad_cols = lambda t, value: torch.cat(  # noqa: E731
            [t[:, : self.cap], torch.full((t.shape[0], extra + 1), value, dtype=t.dtype, device=t.device)], 1)
        self.x, self.pos = pad_cols(self.x, self.pad_id), pad_cols(self.pos, 0)
        if self.k is not None:
            grow = lambda t: torch.cat([t[:, :, : self.cap], t.new_zeros(*t.shape[:2], extra + 1, t.shape[3])], 2)  # noqa: E731
            self.k, self.v = [grow(t) for t in self.k], [grow(t) for t in self.v]
        self.cap = cap

    def add(self, req: Request, mask_id: int, cfg_id: int, smax: int, align: int) -> None:
        """`align`: a block-diffusion model's block size (its attention blocks are positions
        [kB, (k+1)B); decoding windows of block_length, which divides B, are sub-blocks on the same
        grid, and the first one holds the end of the prompt), or 0: blocks of block_length from
        the answer's first column."""
        b = lambda v: torch.tensor([v], dtype=torch.bool, device=self.device)  # noqa: E731
        self.cached = torch.cat([self.cached, b(req.parts.cache.stores_kv)])
        self.exact = torch.cat([self.exact, b(getattr(req.parts.cache, "exact", False))])
        self.early = torch.cat([self.early, b(req.parts.rules.early_stop)])
        p = req.params
        P, L = len(req.prompt), len(req.prompt) + p.gen_length
        if L > self.cap:
            self._grow(L)
        x = torch.full((1, self.cap + 1), self.pad_id, dtype=torch.long)
        x[0, :P] = torch.tensor(req.prompt)
        x[0, P:L] = mask_id
        pos = torch.zeros(1, self.cap + 1, dtype=torch.long)
        pos[0, :L] = torch.arange(L)
        self.x = torch.cat([self.x, x.to(self.device)])
        self.pos = torch.cat([self.pos, pos.to(self.device)])
        t = lambda v: torch.tensor([v], device=self.device)  # noqa: E731
        self.L, self.P = torch.cat([self.L, t(L)]), torch.cat([self.P, t(P)])
        self.blk = torch.cat([self.blk, t(p.block_length)])
        self.spb = torch.cat([self.spb, t(p.steps_per_block)])
        # aligned blocks can be partial: the fixed schedule keeps its tokens per step instead
        self.tps = torch.cat([self.tps, t(max(1, p.gen_length // p.total_steps) if align else 0)])
        e = min((P // p.block_length + 1) * p.block_length, L) if align else P + p.block_length
        self.s, self.e = torch.cat([self.s, t(P)]), torch.cat([self.e, t(e)])
        self.kvx = torch.cat([self.kvx, t(P // align * align if align else 0)])
        self.block, self.step, self.cfg = torch.cat([self.block, t(0)]), torch.cat([self.step, t(0)]), torch.cat([self.cfg, t(cfg_id)])
        self.since = torch.cat([self.since, t(0)])
        if self.quota.shape[1] < smax:
            self.quota = torch.cat([self.quota, self.quota.new_zeros(self.quota.shape[0], smax - self.quota.shape[1])], 1)
        self.quota = torch.cat([self.quota, self.quota.new_zeros(1, self.quota.shape[1])])
        self.start_blocks(torch.tensor([self.n], device=self.device))
        if self.k is not None:
            self.k = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.k]
            self.v = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.v]
        self.reqs.append(req)
        self.settings.append(cfg_id)

    def start_blocks(self, rows: torch.Tensor) -> None:
        """LLaDA's even schedule for rows entering a new (all-masked) block: len // spb per step,
        the remainder first (rows of a block model: as many steps as its tokens per step need)."""
        blk, tps = self.e[rows] - self.s[rows], self.tps[rows]
        spb = torch.where(tps > 0, (blk + tps - 1) // tps.clamp(min=1), self.spb[rows])
        self.spb[rows] = spb
        cols = torch.arange(self.quota.shape[1], device=self.device)[None, :]
        self.quota[rows] = torch.where(cols < spb[:, None], blk[:, None] // spb[:, None] + (cols < (blk % spb)[:, None]), 0)

    def keep(self, keep: torch.Tensor) -> None:
        idx = keep.tolist()
        self.reqs = [self.reqs[i] for i in idx]
        self.settings = [self.settings[i] for i in idx]
        for name in ("x", "pos", "L", "P", "blk", "spb", "tps", "s", "e", "kvx", "block", "step", "cfg", "since", "quota",
                     "cached", "early", "exact"):
            setattr(self, name, getattr(self, name)[keep])
        if self.k is not None:
            self.k, self.v = [t[keep] for t in self.k], [t[keep] for t in self.v]
        if not self.reqs:  # the last row left: free the buffers
            self.k = self.v = None


class _RowsKV:
    """The KV buffer interface the model writes through, over a subset of running rows whose
    query windows start at per-row canvas columns. Fresh keys of padded query columns go to the
    scratch column."""

    def __init__(self, rows: "_Rows", idx: torch.Tensor | None, cols: torch.Tensor, full: bool, num_layers: int) -> None:
        """idx: the rows in the forward, or None for all running rows in order."""
        self.rows, self.idx, self.cols, self.full, self.num_layers = rows, idx, cols, full, num_layers
        self.length = cols.shape[1] if full else rows.cap + 1  # the keys attended over

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        r = self.rows
        if r.k is None:  # first cached request: allocate (N, H_kv, cap + 1, D) per layer
            shape = (r.n, k.shape[1], r.cap + 1, k.shape[3])
            r.k = [k.new_zeros(shape) for _ in range(self.num_layers)]
            r.v = [v.new_zeros(shape) for _ in range(self.num_layers)]
        where = self.cols[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        if self.idx is None:  # every running row: write in place
            kk, vv = r.k[layer].scatter_(2, where, k), r.v[layer].scatter_(2, where, v)
        else:
            kk, vv = r.k[layer][self.idx].scatter_(2, where, k), r.v[layer][self.idx].scatter_(2, where, v)
            r.k[layer][self.idx], r.v[layer][self.idx] = kk, vv
        return (k, v) if self.full else (kk, vv)


class _Recorder:
    """A KV buffer that keeps each layer's fresh keys and values and caches nothing."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        self.k[layer], self.v[layer] = k, v
        return k, v


class Engine:
    def __init__(self, model: DiffusionLM, tokens: TokenIds, config: EngineConfig | None = None) -> None:
        self.model, self.tokens = model, tokens
        # an autoregressive model is a block model with blocks of one token: hidden j scores token
        # j + 1, one prefill forward over the canvas, then each step a cached window [t - 1, t + 1)
        self.causal = bool(model.config.causal)
        self.shift = 1 if self.causal else model.config.logit_shift
        # a block-diffusion model: its attention blocks are the decoding blocks
        self.align = model.config.block_size
        self.config = config or EngineConfig()
        self.device = next(model.parameters()).device
        self.mask = tokens.mask
        self.stop_ids = torch.tensor(tokens.stop, device=self.device)
        self.rows = _Rows(self.device, tokens.pad if tokens.pad is not None else tokens.eos)
        self.waiting: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.configs: dict[tuple, int] = {}  # decoding setting -> id (rows of one id share proposal and policy)
        self.parts_by_cfg: dict[int, DecodeParts] = {}
        self.gens: dict[str, torch.Generator] = {}
        self.trace: list[ForwardRecord] = []
        self._ids = itertools.count()
        self._watching = 0  # watched requests in the engine (their rows cost one transfer per step)
        self._verifying = False  # a running setting's adaptive cache checks its cached commits (refresh_below)
        self.observer = None  # diagnostics (unmask.engine.diagnostics): sees every step, changes none

    # --- requests --------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False) -> Request:
        """Queue a tokenised prompt. `params` must be checked; compat modes are refused. A watched
        request's StepOutputs carry its whole canvas and `Request.proposal` this step's proposals."""
        if params.compat is not None:
            raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
        if len(self.waiting) >= self.config.max_waiting:
            raise UnmaskError(f"the queue is full ({self.config.max_waiting} requests waiting)")
        self._check_block_model(params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise UnmaskError(f"request id {rid!r} is in use")
        if self.causal:  # one token per step, left to right, with the KV cache
            params = replace(params, block_length=1, steps=params.gen_length, policy="fixed", cache="dual",
                             refresh_interval=None, remasking="low_confidence", confidence="prob").check()
        req = Request(rid, list(prompt), params, build_parts(params, self.tokens), time.perf_counter(), watch=watch)
        self.requests[rid] = req
        self.waiting.append(req)
        self._watching += watch
        if params.seed is not None:
            self.gens[rid] = torch.Generator(self.device).manual_seed(params.seed)
        return req

    def _check_block_model(self, p: GenerationParams) -> None:
        exact = getattr(CACHES.lookup(p.cache), "exact", False)
        if not self.align:
            if exact:
                raise UnmaskError(f"cache {p.cache!r} is exact only for block-diffusion models (config bd_size); "
                                  "this model attends over the whole canvas: use none, prefix or dual")
            return
        p.check(self.align)  # the block-model rules (block_length divides bd_size) live in GenerationParams
        if CACHES.lookup(p.cache).stores_kv and not exact:
            raise UnmaskError(f"cache {p.cache!r} approximates a full-attention model's K/V; this block-diffusion "
                              "model's finished blocks are cached exactly: use cache exact (or none)")

    def abort(self, request_id: str) -> bool:
        """Stop a request now; its rows are freed. False if it is unknown or already done."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return False
        if req.status == Status.WAITING:
            self.waiting.remove(req)
        else:
            i = self.rows.reqs.index(req)
            self.rows.keep(torch.tensor([j for j in range(self.rows.n) if j != i], dtype=torch.long,
                                        device=self.device))
        self._finish(req, Status.ABORTED, "abort", None)
        return True

    def release(self, request_id: str) -> None:
        """Forget a finished request (its record is kept until released)."""
        req = self.requests.get(request_id)
        if req is not None and req.done:
            del self.requests[request_id]
            self.gens.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.rows.n)

    @property
    def num_running(self) -> int:
        return self.rows.n

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # --- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        self._admit()
        r = self.rows
        if r.n == 0:
            return []
        shift = self.shift
        self._verifying = any(getattr(self.parts_by_cfg[c].cache, "refresh_below", None) is not None
                              for c in set(r.settings))
        refresh, start, end, fired = self._plan()
        s, e = r.s, r.e
        # a full forward covers the canvas; a block model's prefill only the prompt and first block
        full_len = torch.where(r.exact, end, r.L)
        cost = torch.where(refresh, full_len, end - start)
        # window rows first, then full rows, each oldest first; the first row always runs
        order = torch.argsort(refresh.long() * (r.n + 1) + torch.arange(r.n, device=self.device), stable=True)
        within = torch.cumsum(cost[order], 0) <= self.config.max_num_batched_tokens
        within[0] = True
        run = torch.zeros(r.n, dtype=torch.bool, device=self.device)
        run[order[within]] = True
        # exact-cache rows whose window also holds the block they finished last step: this forward
        # writes that block's final K/V (the commit forward, fused with the next block's first step)
        commit_kv = run & ~refresh & r.exact & (r.kvx < s // max(self.align, 1) * self.align)
        # one host read for the step's shape: widest block, rows of each kind, positions of each kind
        width = cost
        W, n_win, n_full, pos_win, pos_full, n_commit = torch.stack([
            (e - s).max(), (run & ~refresh).sum(), (run & refresh).sum(),
            torch.where(run & ~refresh, width, 0).sum(), torch.where(run & refresh, width, 0).sum(),
            commit_kv.sum()]).tolist()
        committed = torch.zeros(r.n, dtype=torch.long, device=self.device)
        redo = torch.zeros(r.n, dtype=torch.bool, device=self.device)
        forwards = [("window", run & ~refresh, n_win, pos_win), ("full", run & refresh, n_full, pos_full)]
        for i_fwd, (kind, rows, count, positions) in enumerate(forwards):  # a recomputation may append one
            if i_fwd == 1 and self._verifying and bool(redo.any()):
                # rows whose cached step doubted its commit recompute the step: the whole canvas in
                # the full forward, or (scope suffix) the block and masked suffix in one more window
                suffix = redo & self._scope_suffix()
                rows = rows | (redo & ~suffix)
                end = torch.where(suffix, r.L, end)
                count, positions, n_suffix, pos_suffix = torch.stack([
                    rows.sum(), torch.where(rows, full_len, 0).sum(), suffix.sum(),
                    torch.where(suffix, r.L - start, 0).sum()]).tolist()
                if n_suffix:
                    forwards.append(("window", suffix, n_suffix, pos_suffix))
            if count == 0:
                continue
            all_rows = count == r.n
            idx = torch.arange(r.n, device=self.device) if all_rows else rows.nonzero().squeeze(-1)
            t0 = time.perf_counter()
            if self.observer is not None:  # the exact logits of the same canvas, before this step's commits
                fresh = self._fresh(idx, s, shift, W)
            logits = self._forward(kind, idx, start, end, s, shift, W, all_rows)
            n, doubt = self._commit(idx, logits, s, W, verify=i_fwd == 0 and self._verifying)
            committed[idx] = n
            if doubt is not None:
                redo[idx] = doubt
            if self.observer is not None:
                self.observer.observe(self, kind, idx, s, W, logits, fresh, self._last_commit)
            label = "commit" if kind == "window" and n_commit else kind
            self.trace.append(ForwardRecord(label, count, positions / count, n.sum(), time.perf_counter() - t0,
                                            n_commit if label == "commit" else 0))
        r.since = torch.where(run, torch.where(refresh | fired | redo, 0, r.since) + committed, r.since)
        if self.align:  # K/V is exact up to the open block once a forward has computed it
            r.kvx = torch.where(run & r.exact, s // self.align * self.align, r.kvx)
        outputs = self._advance(run, s, e, committed, commit_kv, redo)
        for rec in self.trace[-3:]:  # committed counts are read with the step's bookkeeping
            if isinstance(rec.committed, torch.Tensor):
                rec.committed = int(rec.committed)
        return outputs

    def _admit(self) -> None:
        if self.config.scheduling == "static":
            if self.rows.n or not self.waiting:
                return  # the running batch drains first
            full = len(self.waiting) >= self.config.max_num_seqs
            if not full and time.perf_counter() - self.waiting[0].arrival < self.config.static_wait:
                return
        while self.waiting and self.rows.n < self.config.max_num_seqs:
            req = self.waiting.pop(0)
            key = _setting(req.params)
            cfg = self.configs.setdefault(key, len(self.configs))
            self.parts_by_cfg.setdefault(cfg, req.parts)
            smax = req.params.block_length if self.align else max(req.params.steps_per_block, 1)
            self.rows.add(req, self.mask, cfg, smax, self.align)
            req.status = Status.RUNNING

    def _plan(self):
        """Per row: does this step refresh (full forward), and the window [start, end) otherwise."""
        r = self.rows
        shift = self.shift
        s = r.s
        refresh = torch.ones(r.n, dtype=torch.bool, device=self.device)
        fired = torch.zeros_like(refresh)  # an adaptive cache's token trigger refreshed the row (any scope)
        start, end = torch.zeros_like(s), r.L.clone()
        for cfg in sorted(set(r.settings)):
            rows = r.cfg == cfg
            cache = self.parts_by_cfg[cfg].cache
            if not cache.stores_kv:
                continue
            if getattr(cache, "exact", False):  # a block model: one prefill, then the open block
                refresh = torch.where(rows, (r.step == 0) & (r.block == 0), refresh)
                whole = torch.ones_like(refresh) if not cache.sub_block_cache else r.step == 0
                attn_end = torch.minimum((s // self.align + 1) * self.align, r.L)
                sub_start = torch.minimum(s // r.blk * r.blk, s - shift)  # with the prompt's end, in the first
                start = torch.where(rows, torch.where(whole, torch.minimum(r.kvx, s - shift), sub_start), start)
                end = torch.where(rows, torch.where(whole, attn_end, r.e), end)
                continue
            ri = cache.refresh_interval
            fresh = r.step == 0
            if self.causal:  # exact cache: only the prefill is a full forward
                fresh = fresh & (r.block == 0)
            if ri is not None:
                fresh = fresh | (r.step % ri == 0)
            window_end = cache.window_end(r.e, r.L)
            if getattr(cache, "refresh_tokens", None) is not None:  # stale: tokens committed since the last refresh
                trig = (r.since >= cache.refresh_tokens) & ~fresh
                fired = fired | (rows & trig)
                if cache.refresh_scope == "canvas":
                    fresh = fresh | trig
                else:  # recompute the block and the masked suffix against the block start's prefix K/V
                    window_end = torch.where(trig, r.L, window_end)
            refresh = torch.where(rows, fresh, refresh)
            start = torch.where(rows, s - shift, start)
            end = torch.where(rows, window_end, end)
        return refresh, start, end, fired

    def _scope_suffix(self) -> torch.Tensor:
        """Rows whose adaptive cache refreshes only the block and the masked suffix."""
        r = self.rows
        cfgs = [c for c in set(r.settings) if getattr(self.parts_by_cfg[c].cache, "refresh_scope", None) == "suffix"]
        return torch.isin(r.cfg, torch.tensor(cfgs, dtype=torch.long, device=self.device))

    def _forward(self, kind: str, idx: torch.Tensor, start, end, s, shift: int, W: int, all_rows: bool) -> torch.Tensor:
        """Logits (B, W, V) for each row's block columns [s, s + W) (W = the widest block; columns
        past a row's own block are padding). `all_rows`: idx is every running row, in order."""
        r = self.rows
        ar = torch.arange(W, device=self.device)[None, :]
        if kind == "full":
            lens = torch.where(r.exact[idx], end[idx], r.L[idx])  # a block model's prefill stops at its first block
            Lmax = int(lens.max())
            ids, pos = r.x[idx, :Lmax], r.pos[idx, :Lmax]
            key_mask = torch.arange(Lmax, device=self.device)[None, :] < lens[:, None]
            key_mask = None if bool(key_mask.all()) else key_mask
            kv = None
            if bool(r.cached[idx].any()):
                cols = torch.arange(Lmax, device=self.device)[None, :].expand(idx.numel(), -1)
                cols = torch.where(cols < lens[:, None], cols, r.cap)
                kv = _RowsKV(r, None if all_rows else idx, cols, True, self.model.config.num_layers)
            hidden = (s[idx, None] - shift + ar).clamp(0, Lmax - 1)
            return self.model(ids, pos, kv, 0, key_mask, hidden)
        q = int((end - start)[idx].max())  # the widest window (one small read)
        aq = torch.arange(q, device=self.device)[None, :]
        valid = aq < (end - start)[idx, None]
        cols = torch.where(valid, start[idx, None] + aq, r.cap)
        ids, pos = r.x[idx].gather(1, cols), r.pos[idx].gather(1, cols)
        key_mask = torch.arange(r.cap + 1, device=self.device)[None, :] < r.L[idx, None]
        kv = _RowsKV(r, None if all_rows else idx, cols, False, self.model.config.num_layers)
        hidden = (ar + (s[idx, None] - shift - start[idx, None])).clamp(0, q - 1)
        return self.model(ids, pos, kv, start[idx], key_mask, hidden)  # per-row first query column

    def _fresh(self, idx: torch.Tensor, s: torch.Tensor, shift: int, W: int):
        """For diagnostics: an uncached full forward over the rows' current canvases (nothing is
        written to the KV rows): logits at the block columns, and every layer's fresh K/V."""
        r = self.rows
        Lmax = int(r.L[idx].max())
        key_mask = torch.arange(Lmax, device=self.device)[None, :] < r.L[idx, None]
        key_mask = None if bool(key_mask.all()) else key_mask
        rec = _Recorder(Lmax)
        hidden = (s[idx, None] - shift + torch.arange(W, device=self.device)[None, :]).clamp(0, Lmax - 1)
        logits = self.model(r.x[idx, :Lmax], r.pos[idx, :Lmax], rec, 0, key_mask, hidden)
        return logits, rec

    def _commit(self, idx: torch.Tensor, logits: torch.Tensor, s: torch.Tensor, W: int, verify: bool = False):
        """Propose, select and write for rows `idx`; returns tokens committed per row, and with
        `verify` (a cached window forward) the rows whose adaptive cache doubts this step: it would
        commit a token with cached probability below the cache's `refresh_below`. Those rows commit
        nothing here; the step recomputes them (a full forward, or block and masked suffix)."""
        r = self.rows
        ar = torch.arange(W, device=self.device)[None, :]
        valid = ar < (r.e - s)[idx, None]
        cols = torch.where(valid, s[idx, None] + ar, r.cap)
        x = r.x[idx]
        cand = (x.gather(1, cols) == self.mask) & valid
        tokens = torch.zeros_like(cols)
        commit = torch.zeros_like(cand)
        doubt = torch.zeros(idx.numel(), dtype=torch.bool, device=self.device)
        cfgs = r.cfg[idx]
        distinct = sorted(set(r.settings))
        for cfg in distinct:
            if len(distinct) == 1:  # one setting (the usual case): every row, no index to compute
                sel = torch.arange(idx.numel(), device=self.device)
            else:
                sel = (cfgs == cfg).nonzero().squeeze(-1)
                if sel.numel() == 0:
                    continue
            parts = self.parts_by_cfg[cfg]
            tok, score, ent = self._propose(parts, idx[sel], logits[sel])
            quota = None
            if parts.policy.uses_schedule:
                q = r.quota[idx[sel]].gather(1, r.step[idx[sel], None].clamp(max=r.quota.shape[1] - 1)).squeeze(1)
                over = r.step[idx[sel]] >= r.spb[idx[sel]]  # a quota could not be met: finish the block
                quota = torch.where(over, cand[sel].sum(-1), q)
            # native policies ignore the step index (only Dream's compat policy reads it)
            c = parts.policy.select(score, ent, cand[sel], quota, 0, None) & cand[sel]
            below = getattr(parts.cache, "refresh_below", None)
            if verify and below is not None:
                lg = logits[sel].float()  # the probability of each proposed token, without a full softmax
                prob = (lg.gather(-1, tok[..., None]).squeeze(-1) - lg.logsumexp(-1)).exp()
                doubt[sel] = (c & (prob < below)).any(-1)
            tokens[sel], commit[sel] = tok, c
        watched = [i for i, row in enumerate(idx.tolist()) if r.reqs[row].watch] if self._watching else []
        if watched:  # the playground's view: what each open position would become this step
            open_ = (cand & ~commit)[watched].tolist()
            props, where = tokens[watched].tolist(), (cols[watched] - s[idx[watched], None]).tolist()
            for k, i in enumerate(watched):
                req = r.reqs[int(idx[i])]
                base = int(s[idx[i]]) - int(r.P[idx[i]])
                req.proposal = {base + w: t for w, t, o in zip(where[k], props[k], open_[k]) if o}
        if verify:
            commit = commit & ~doubt[:, None]
        self._last_commit = (commit, tokens, cand)
        new = torch.where(commit, tokens, x.gather(1, cols))
        x.scatter_(1, cols, new)
        x[:, r.cap] = r.pad_id
        r.x[idx] = x
        return commit.sum(-1), (doubt if verify else None)

    def _propose(self, parts: DecodeParts, idx: torch.Tensor, logits: torch.Tensor):
        """Proposals for rows of one setting: batched, except that a row with its own random
        generator (a seed, with sampling or random order) draws alone, from its own generator and
        in its own shape, so its draws do not depend on the other rows."""
        cfg = parts.proposal
        sampled = cfg.temperature > 0 or cfg.confidence == "random"
        if not sampled:
            p = propose(logits, cfg, None)
            return p.tokens, p.score, p.entropy
        width = (self.rows.e - self.rows.s)[idx].tolist()
        out = [propose(logits[i : i + 1, : width[i]], cfg, self.gens.get(self.rows.reqs[row].id))
               for i, row in enumerate(idx.tolist())]
        W = logits.shape[1]
        pad = lambda t, v: torch.nn.functional.pad(t, (0, W - t.shape[1]), value=v)  # noqa: E731
        tokens = torch.cat([pad(p.tokens, self.mask) for p in out])
        score = torch.cat([pad(p.score, -torch.inf) for p in out])
        ent = None if out[0].entropy is None else torch.cat([pad(p.entropy, torch.inf) for p in out])
        return tokens, score, ent

    def _advance(self, run: torch.Tensor, s: torch.Tensor, e: torch.Tensor, committed: torch.Tensor,
                 commit_kv: torch.Tensor, redo: torch.Tensor) -> list[StepOutput]:
        """Per-row bookkeeping after the forwards: steps, block ends, finished rows, streaming."""
        r = self.rows
        cols = torch.arange(r.cap + 1, device=self.device)[None, :]
        in_gen = (cols >= r.P[:, None]) & (cols < r.L[:, None])
        masked = (r.x == self.mask) & in_gen
        block_open = (masked & (cols >= s[:, None]) & (cols < e[:, None])).any(-1)
        # contiguous committed prefix of the answer: up to the first mask (or the end)
        first_mask = torch.where(masked.any(-1), masked.int().argmax(-1), r.L)
        prefix = first_mask - r.P
        block_done = run & ~block_open
        last_block = e >= r.L
        is_stop = torch.isin(r.x, self.stop_ids) & in_gen
        has_stop = is_stop.any(-1)
        first_stop = torch.where(has_stop, is_stop.int().argmax(-1), r.L)
        stopped = has_stop & (first_mask > first_stop)  # end of text committed, nothing masked before it
        done = run & ((block_done & last_block) | (stopped & r.early))
        advance = block_done & ~done
        r.step = torch.where(run & ~block_done, r.step + 1, r.step)
        r.block = torch.where(advance, r.block + 1, r.block)
        r.s, r.e = torch.where(advance, e, s), torch.where(advance, torch.minimum(e + r.blk, r.L), e)
        r.step = torch.where(advance, torch.zeros_like(r.step), r.step)
        if bool(advance.any()):
            r.start_blocks(advance.nonzero().squeeze(-1))
        stuck = run & block_open & (committed == 0)
        info = torch.stack([run.long(), committed, prefix, done.long(), stuck.long(), commit_kv.long(), redo.long()],
                           1).tolist()
        grew = [i for i, (ran, _, pre, _, _, _, _) in enumerate(info)
                if ran and (pre > r.reqs[i].committed or r.reqs[i].watch)]
        rows_x = dict(zip(grew, r.x[grew].tolist())) if grew else {}  # one transfer for every row that grew
        now = time.perf_counter()
        outputs = []
        for i, (req, (ran, n, pre, fin, bad, ckv, again)) in enumerate(zip(list(r.reqs), info)):
            if bad:
                raise RuntimeError(f"request {req.id}: a step committed nothing while its block is open (policy bug)")
            if not ran:
                continue
            req.nfe += 1 + again  # a doubted cached step ran twice: its window, then a full forward
            req.commit_forwards += ckv
            req.commits += [0, n] if again else [n]
            req.started = req.started or now
            new_ids, canvas = [], None
            if i in rows_x:
                P = len(req.prompt)
                if pre > req.committed:
                    new_ids = rows_x[i][P + req.committed : P + pre]
                    req.first_commit = req.first_commit or now
                    req.committed = pre
                if req.watch:
                    canvas = rows_x[i][P : P + req.params.gen_length]
            outputs.append(StepOutput(req, pre, new_ids, bool(fin), canvas))
        if bool(done.any()):
            gone = done.nonzero().squeeze(-1).tolist()
            rows_all = r.x[gone].tolist()
            reqs = list(r.reqs)
            r.keep((~done).nonzero().squeeze(-1))
            stops = set(self.tokens.stop)
            for i, row in zip(gone, rows_all):
                req = reqs[i]
                P = len(req.prompt)
                canvas = row[P : P + req.params.gen_length]
                reason = "stop" if any(t in stops for t in canvas) else "length"
                self._finish(req, Status.FINISHED, reason, canvas)
        return outputs

    def _finish(self, req: Request, status: Status, reason: str, canvas: list[int] | None) -> None:
        req.status, req.finish_reason, req.finished = status, reason, time.perf_counter()
        req.canvas = canvas
        self._watching -= req.watch


def _setting(p: GenerationParams) -> tuple:
    """Rows with equal settings share one proposal and one commit policy call."""
    return (p.policy, p.remasking, p.confidence, p.threshold, p.factor, p.gamma, p.budget, p.cache,
            p.refresh_interval, p.refresh_tokens, p.refresh_below, p.refresh_scope,
            p.temperature, p.top_k, p.top_p, p.seed is not None, p.early_stop,
            p.block_length, p.total_steps)
