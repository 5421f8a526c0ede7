"""The request engine for DFlash speculative decoding: an autoregressive target and a DFlash
drafter (unmask.models.dflash), `add_request` / `step` / `abort` as unmask.engine.Engine.

Every request is a row of batched tensors: its tokens (prompt, then the verified output), its
verified length, its rows of the target's KV cache and of the drafter's context cache, and the
target features the drafter has not read yet. A request joins at the next step (continuous
batching) and leaves the step it finishes. One step:
1. admit waiting requests; the new rows run one prefill forward of the target over their
   prompts (right-padded, one batch): its last logits give the first output token, its features
   of every prompt position are the drafter's first context;
2. draft: one drafter forward over every running row's block `[last verified token, MASK x
   (B - 1)]` at that row's positions, reading the features it has not read (appended to its
   context cache); the drafts are the argmax of the target's head (the release drafts greedily);
3. verify: one target forward over every row's block at its own positions against its KV rows;
   the target's choice at each position (argmax, or a sample at the row's temperature from the
   row's own generator when it has a seed), the accepted length is the leading run where the
   draft equals that choice, and the row gains the accepted drafts plus the target's next token
   (its bonus): between 1 and B tokens for one target forward;
4. rollback is a length: keys past a row's verified length are masked and rewritten by its next
   block, in both caches; the features of the accepted positions are the drafter's next context;
5. a row finishes at a stop token (cut after it) or at gen_length (cut there).
Every generated token is the target's own choice given the tokens before it, so greedy output
equals the target's greedy output and sampled output follows its distribution, whatever the
drafter proposes (tests/test_speculative.py). Per-step host reads: one for the step's shape, one
for the new tokens and accepted lengths of every row.
"""

import time
from collections import deque

import torch

from unmask.engine.front import RequestFront
from unmask.engine.request import EngineConfig, Request, Status, StepOutput
from unmask.engine.runner import RowsKV
from unmask.models.base import DiffusionLM, TokenIds
from unmask.models.dflash import DFlashDrafter
from unmask.params import GenerationParams
from unmask.trace import ForwardRecord


class _DraftKV:
    """The drafter's context cache over every running row: per layer (n, H_kv, cap + 1, D); the new
    context of row r goes to columns [dlen_r, dlen_r + count_r), its padding to the scratch column."""

    def __init__(self, rows: "SpecRows", cols: torch.Tensor) -> None:
        self.rows, self.cols = rows, cols

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, context: int):
        r, c = self.rows, context
        if r.dk is None:
            shape = (r.n, k.shape[1], r.cap + 1, k.shape[3])
            r.dk = [k.new_zeros(shape) for _ in range(r.draft_layers)]
            r.dv = [v.new_zeros(shape) for _ in range(r.draft_layers)]
        where = self.cols[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        kk = r.dk[layer].scatter_(2, where, k[:, :, :c])
        vv = r.dv[layer].scatter_(2, where, v[:, :, :c])
        return torch.cat([kk, k[:, :, c:]], 2), torch.cat([vv, v[:, :, c:]], 2)


class SpecRows:
    """The running requests' tensors (n rows); `cap` columns plus a scratch column."""

    def __init__(self, device, pad: int, layers: int, draft_layers: int) -> None:
        self.device, self.pad, self.num_layers, self.draft_layers = device, pad, layers, draft_layers
        z = lambda dtype=torch.long: torch.zeros(0, dtype=dtype, device=device)  # noqa: E731
        self.x = torch.zeros(0, 1, dtype=torch.long, device=device)  # (n, cap + 1) prompt, then output
        self.P, self.G, self.ver, self.dlen = z(), z(), z(), z()  # prompt, gen_length, verified, drafter context
        self.early, self.temp = z(torch.bool), z(torch.float32)
        self.pend: torch.Tensor | None = None  # (n, w, F) target features the drafter has not read
        self.pc = z()  # (n,) how many of them
        self.reqs: list[Request] = []
        self.cap = 0
        self.k = self.v = self.dk = self.dv = None  # KV rows, allocated by the first forward

    @property
    def n(self) -> int:
        return len(self.reqs)

    def grow(self, cap: int) -> None:
        extra = cap - self.cap
        self.x = torch.cat([self.x[:, : self.cap], self.x.new_full((self.n, extra + 1), self.pad)], 1)
        pad = lambda t: torch.cat([t[:, :, : self.cap], t.new_zeros(*t.shape[:2], extra + 1, t.shape[3])], 2)  # noqa: E731
        for name in ("k", "v", "dk", "dv"):
            if getattr(self, name) is not None:
                setattr(self, name, [pad(t) for t in getattr(self, name)])
        self.cap = cap

    def keep(self, keep: torch.Tensor) -> None:
        self.reqs = [self.reqs[i] for i in keep.tolist()]
        for name in ("x", "P", "G", "ver", "dlen", "early", "temp", "pc"):
            setattr(self, name, getattr(self, name)[keep])
        if self.pend is not None:
            self.pend = self.pend[keep]
        for name in ("k", "v", "dk", "dv"):
            if getattr(self, name) is not None:
                setattr(self, name, [t[keep] for t in getattr(self, name)])
        if not self.reqs:
            self.k = self.v = self.dk = self.dv = self.pend = None


class SpecEngine(RequestFront):
    def __init__(self, target: DiffusionLM, drafter: DFlashDrafter, tokens: TokenIds,
                 config: EngineConfig | None = None) -> None:
        super().__init__(target.config, next(target.parameters()).device, config)
        self.model, self.drafter, self.tokens = target, drafter, tokens
        c = drafter.config
        self.B = c.block_size
        self.layers = tuple(c.target_layer_ids)
        self.mask = c.mask_token_id if c.mask_token_id is not None else tokens.mask
        self.stop_ids = torch.tensor(tokens.stop, device=self.device)
        self.rows = SpecRows(self.device, tokens.pad if tokens.pad is not None else tokens.eos,
                             target.config.num_layers, c.num_layers)
        self.trace: deque[ForwardRecord] = deque(maxlen=self.config.trace_limit)

    # --- requests (as Engine) --------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False) -> Request:
        """Queue a tokenised prompt; an autoregressive model's fields apply (gen_length,
        temperature, seed, early_stop)."""
        return self._new_request(prompt, params, request_id, watch, None)

    def _drop_row(self, req: Request) -> None:
        i = self.rows.reqs.index(req)
        self.rows.keep(torch.tensor([j for j in range(self.rows.n) if j != i], dtype=torch.long, device=self.device))

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.rows.n)

    @property
    def num_running(self) -> int:
        return self.rows.n

    # --- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        new = self.scheduler.admit(self.rows.n)
        outputs: list[StepOutput] = []
        if new:
            outputs += self._prefill(new)
        if self.rows.n:
            outputs += self._round()
        return outputs

    def _prefill(self, reqs: list[Request]) -> list[StepOutput]:
        """Add the rows, run the target over their prompts, take each row's first output token."""
        t0 = time.perf_counter()
        r, dev = self.rows, self.device
        first = r.n
        lens = [len(q.prompt) for q in reqs]
        need = max(p + q.params.gen_length + self.B for p, q in zip(lens, reqs))
        if need > r.cap:
            r.grow(need)
        Pmax, k = max(lens), len(reqs)
        x = torch.full((k, r.cap + 1), r.pad, dtype=torch.long)
        for i, q in enumerate(reqs):
            x[i, : lens[i]] = torch.tensor(q.prompt)
            q.status, q.started = Status.RUNNING, t0
        x = x.to(dev)
        P = torch.tensor(lens, device=dev)
        r.x = torch.cat([r.x, x])
        r.P = torch.cat([r.P, P])
        r.G = torch.cat([r.G, torch.tensor([q.params.gen_length for q in reqs], device=dev)])
        r.ver = torch.cat([r.ver, P])
        r.dlen = torch.cat([r.dlen, torch.zeros(k, dtype=torch.long, device=dev)])
        r.early = torch.cat([r.early, torch.tensor([q.params.early_stop for q in reqs], device=dev)])
        r.temp = torch.cat([r.temp, torch.tensor([float(q.params.temperature) for q in reqs], device=dev)])
        r.pc = torch.cat([r.pc, P])
        for name in ("k", "v", "dk", "dv"):
            if getattr(r, name) is not None:
                setattr(r, name, [torch.cat([t, t.new_zeros(k, *t.shape[1:])]) for t in getattr(r, name)])
        r.reqs += reqs
        idx = torch.arange(first, first + k, device=dev)
        cols = torch.arange(Pmax, device=dev)[None, :].expand(k, -1)
        real = cols < P[:, None]
        kv = RowsKV(r, idx, torch.where(real, cols, r.cap), True, r.num_layers)
        logits, feats = self.model(x[:, :Pmax], cols, kv, 0, None if bool(real.all()) else real,
                                   (P - 1)[:, None], capture=self.layers)
        feats = torch.where(real[..., None], feats, 0)
        if r.pend is None or r.pend.shape[0] == 0:
            r.pend = feats
        else:
            w = max(r.pend.shape[1], Pmax)
            pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], w - t.shape[1], t.shape[2])], 1)  # noqa: E731
            r.pend = torch.cat([pad(r.pend), pad(feats)])
        tokens = self._choose(logits, idx)  # (k, 1)
        at = P[:, None]
        r.x[first:] = r.x[first:].scatter(1, at, tokens)
        r.ver[first:] = P + 1
        rec = ForwardRecord("full", k, float(sum(lens)) / k, 0, time.perf_counter() - t0)
        self.trace.append(rec)
        return self._advance(idx, tokens, torch.ones(k, dtype=torch.long, device=dev), P, rec, drafted=False)

    def _round(self) -> list[StepOutput]:
        """One draft forward and one verify forward over every running row."""
        r, B, dev = self.rows, self.B, self.device
        n = r.n
        t0 = time.perf_counter()
        start = r.ver - 1  # the last verified token: the block's first position, not yet in the target's cache
        ar = torch.arange(B, device=dev)[None, :]
        block = torch.full((n, B), self.mask, dtype=torch.long, device=dev)
        block[:, 0] = r.x.gather(1, start[:, None])[:, 0]
        bpos = start[:, None] + ar
        w = r.pend.shape[1]
        aw = torch.arange(w, device=dev)[None, :]
        fresh = aw < r.pc[:, None]
        cols = torch.where(fresh, r.dlen[:, None] + aw, r.cap)
        keys = torch.arange(r.cap + 1, device=dev)[None, :] < (r.dlen + r.pc)[:, None]
        mask = torch.cat([keys, torch.ones(n, B, dtype=torch.bool, device=dev)], 1)[:, None, None, :]
        hidden = self.drafter(self.model.embed(block), r.pend, torch.cat([r.dlen[:, None] + aw, bpos], 1),
                              _DraftKV(r, cols), mask)
        block[:, 1:] = self.model.head(hidden[:, 1:]).argmax(-1)
        r.dlen = r.dlen + r.pc
        t1 = time.perf_counter()
        kv = RowsKV(r, None, bpos, False, r.num_layers)
        key_mask = torch.arange(r.cap + 1, device=dev)[None, :] < (start + B)[:, None]
        logits, feats = self.model(block, bpos, kv, start, key_mask, None, capture=self.layers)
        choice = self._choose(logits, None)  # (n, B): the target's token after each block position
        accepted = (block[:, 1:] == choice[:, :-1]).long().cumprod(1).sum(1)  # drafts kept
        gained = accepted + 1  # and the target's own next token
        ok = ar < gained[:, None]
        r.x = r.x.scatter(1, torch.where(ok, r.ver[:, None] + ar, r.cap), choice)
        old = r.ver
        r.ver = r.ver + gained
        r.pend, r.pc = feats, gained
        t2 = time.perf_counter()
        self.trace.append(ForwardRecord("draft", n, float(B + w), 0, t1 - t0))
        rec = ForwardRecord("verify", n, float(B), 0, t2 - t1)
        self.trace.append(rec)
        return self._advance(torch.arange(n, device=dev), choice, gained, old, rec, drafted=True)

    def _choose(self, logits: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
        """The target's token at every position: argmax, or for rows with a temperature a sample
        from softmax(logits / T), drawn from the row's own generator when it has a seed (alone,
        in order), else together from torch's global generator."""
        r = self.rows
        temp = r.temp if idx is None else r.temp[idx]
        out = logits.argmax(-1)
        hot = temp > 0
        if not bool(hot.any()):
            return out
        reqs = r.reqs if idx is None else [r.reqs[i] for i in idx.tolist()]
        probs = torch.softmax(logits.float() / temp.clamp(min=1e-5)[:, None, None], -1)
        flat = probs.reshape(-1, probs.shape[-1])
        drawn = torch.multinomial(flat, 1).view(probs.shape[:-1])
        for i, q in enumerate(reqs):  # seeded requests: their own draws (host work per seeded row)
            g = self.generators.get(q.id)
            if g is not None and q.params.temperature > 0:
                drawn[i] = torch.multinomial(probs[i], 1, generator=g)[:, 0]
        return torch.where(hot[:, None], drawn, out)

    def _advance(self, idx: torch.Tensor, choice: torch.Tensor, gained: torch.Tensor, old: torch.Tensor,
                 rec: ForwardRecord, drafted: bool) -> list[StepOutput]:
        """Record the rows' new tokens (and their count on the forward's record), finish rows at a
        stop token or their length, free them."""
        r, dev = self.rows, self.device
        B = choice.shape[1]
        ar = torch.arange(B, device=dev)[None, :]
        valid = ar < gained[:, None]
        is_stop = torch.isin(choice, self.stop_ids) & valid & r.early[idx, None]
        stop_at = torch.where(is_stop.any(1), is_stop.float().argmax(1) + 1, gained)  # tokens kept, up to a stop
        room = r.G[idx] - (old - r.P[idx])  # tokens the row may still take
        kept = torch.minimum(stop_at, room)
        finished = is_stop.any(1) | (kept >= room)
        now = time.perf_counter()
        host = torch.cat([choice, gained[:, None], kept[:, None], finished[:, None].long()], 1).tolist()
        outputs, done = [], []
        for i, row in zip(idx.tolist(), host):
            q = r.reqs[i]
            toks, g, k, fin = row[:B], row[B], row[B + 1], row[B + 2]
            q.nfe += 1
            q.commits.append(g)
            out = StepOutput(q, 0, toks[:k], bool(fin))
            if drafted:
                q.draft_forwards += 1
                out.drafted, out.accepted = B - 1, g - 1
                q.drafted += B - 1
                q.accepted += g - 1
            new_ids = out.new_ids
            if q.first_commit is None and new_ids:
                q.first_commit = now
            q.committed += len(new_ids)
            rec.committed += len(new_ids)
            if fin:
                done.append(i)
                gen = r.x[i, int(r.P[i]) : int(r.P[i]) + q.committed].tolist()
                self._finish(q, Status.FINISHED, "stop" if is_stop_row(new_ids, self.tokens.stop) else "length", gen)
            out.committed = q.committed
            if q.watch:  # the playground: the whole answer so far (every token of it is final)
                out.canvas = r.x[i, int(r.P[i]) : int(r.P[i]) + q.committed].tolist()
            outputs.append(out)
        if done:
            gone = set(done)
            r.keep(torch.tensor([j for j in range(r.n) if j not in gone], dtype=torch.long, device=dev))
        return outputs


def is_stop_row(ids: list[int], stop: tuple[int, ...]) -> bool:
    return bool(ids) and ids[-1] in stop
