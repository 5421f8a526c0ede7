"""The speculative row kind: DFlash speculative decoding, an autoregressive target and a DFlash
drafter (unmask.models.dflash), stepped by the one engine (engine.py).

Every request is a row of batched tensors: its tokens (prompt, then the verified output), its
verified length, its rows of the target's KV cache and of the drafter's context cache, and the
target features the drafter has not read yet. A request joins at the next step (continuous
batching) and leaves the step it finishes. A row's cost is its prefill (its first step), its
drafter context and two blocks; the engine's token budget picks the rows that run. One step of
the rows that run:
1. rows new to the engine run one prefill forward of the target over their prompts
   (right-padded, one batch): its last logits give the first output token, its features of every
   prompt position are the drafter's first context;
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
A constrained row (structured output, unmask.constrain) takes, at each verified position, the
target's argmax among the tokens its grammar allows (RowGrammar.verify, on the host): its output
is the constrained autoregressive output, drafts accepted while they equal it.
Every generated token is the target's own choice given the tokens before it, so greedy output
equals the target's greedy output and sampled output follows its distribution, whatever the
drafter proposes (tests/test_speculative.py). The step reports every running row's new tokens
(those of its prefill and of its block) in one transfer.
"""

import time
from dataclasses import dataclass

import torch

from unmask.engine.kind import ROW_KINDS, Cost, KindContext, Report, Stats, check_compat_family
from unmask.engine.logprobs import Logprobs
from unmask.engine.masked import accept_causal, causal_takes
from unmask.engine.rows import Rows, per_row
from unmask.errors import UnmaskError
from unmask.kv.prefix import PrefixStore
from unmask.kv.rows import DraftKV, RowsKV
from unmask.trace import ForwardRecord


@dataclass
class SpecStats(Stats):
    draft_forwards: int = 0  # drafter forwards (each proposes block_size - 1 tokens)
    drafted: int = 0  # draft tokens proposed to the target
    accepted: int = 0  # of those, the ones the target accepted


@dataclass
class SpecRows(Rows):
    """A speculative row: its tokens (prompt, then the verified output), its target K/V and
    drafter context cache, and the target features the drafter has not read."""

    x: torch.Tensor = per_row(cols=True, fill="pad")  # (n, cap + 1)
    P: torch.Tensor = per_row()  # prompt length
    G: torch.Tensor = per_row()  # gen_length
    ver: torch.Tensor = per_row()  # verified length (prompt and output)
    dlen: torch.Tensor = per_row()  # drafter context written
    new: torch.Tensor = per_row(torch.bool)  # not prefilled yet
    early: torch.Tensor = per_row(torch.bool)
    temp: torch.Tensor = per_row(torch.float32)
    pc: torch.Tensor = per_row()  # target features the drafter has not read (their count)
    reused: torch.Tensor = per_row()  # prompt columns whose K/V (both caches) came from the prefix cache
    pend: torch.Tensor | None = per_row(torch.float32, lazy=True)  # (n, w, F) those features
    k: list | None = per_row(layers=True)  # the target's K/V rows
    v: list | None = per_row(layers=True)
    dk: list | None = per_row(layers=True)  # the drafter's context cache
    dv: list | None = per_row(layers=True)
    num_layers: int = 0
    draft_layers: int = 0

    def put_pend(self, idx: torch.Tensor | None, feats: torch.Tensor) -> None:
        """Rows `idx`' (None: every row) unread features become `feats` (k, w, F) (widths padded
        to fit)."""
        if idx is None:
            self.pend = feats
            return
        if self.pend is None:
            self.pend = feats.new_zeros(self.n, feats.shape[1], feats.shape[2])
        w = max(self.pend.shape[1], feats.shape[1])
        pad = lambda t: t if t.shape[1] == w else torch.cat(  # noqa: E731
            [t, t.new_zeros(t.shape[0], w - t.shape[1], t.shape[2])], 1)
        self.pend = pad(self.pend)
        self.pend[idx] = pad(feats)


@ROW_KINDS.register
class SpecKind:
    name = "speculative"
    Stats = SpecStats
    diagnoses, observer = False, None

    @classmethod
    def suits(cls, arch, drafter) -> bool:
        """An autoregressive target with a drafter."""
        return drafter is not None and arch.kind == "causal"

    @classmethod
    def takes(cls, arch, tokens):
        """The target's (engine/masked.py `causal_takes`: text after a hole prefix-suffix-middle
        where it reads it); structured output on greedy rows only (RowGrammar.verify checks the
        drafter's tokens greedily)."""
        return causal_takes(arch, tokens, decodes="speculative",
                            sampled_constraint="structured output on speculative rows is greedy: temperature must be 0")

    @classmethod
    def accept(cls, params, arch, given: frozenset | None, engine: bool):
        """The target's: an autoregressive model's parameters (engine/masked.py `accept_causal`)."""
        return accept_causal(params, arch, given)

    @classmethod
    def mask_token(cls, arch) -> str:
        """The drafter's block placeholder: the drafter's mask token (or any id the target never writes)."""
        return "placeholder"

    @classmethod
    def screen(cls, given: dict, arch) -> dict:
        """The target's: a named reference mode's family; the rest `accept` checks."""
        return check_compat_family(given, arch)

    def __init__(self, ctx: KindContext) -> None:
        if ctx.drafter is None:
            from unmask.errors import UnmaskError
            raise UnmaskError("speculative rows need a drafter (LLM(..., draft=PATH))")
        self.model, self.drafter, self.tokens, self.device, self.draws = (ctx.model, ctx.drafter, ctx.tokens,
                                                                          ctx.device, ctx.draws)
        c = self.drafter.config
        self.B = c.block_size
        self.layers = tuple(c.target_layer_ids)
        self.mask = c.mask_token_id if c.mask_token_id is not None else self.tokens.mask
        self.stop_ids = torch.tensor(self.tokens.stop, device=self.device)
        self.rows = SpecRows(self.device, self.tokens.pad if self.tokens.pad is not None else self.tokens.eos,
                             num_layers=self.model.config.num_layers, draft_layers=c.num_layers)
        self.sampling = 0  # running rows with a temperature
        self.watching = 0  # watched rows (the playground: their whole answer each step)
        self.constrained = 0  # running rows with a grammar (structured output)
        self.logprobs = Logprobs(self.rows)  # rows that report their tokens' log-probabilities (the target's)
        # prompt K/V shared across requests (kv/prefix.py): the target's and the drafter's context,
        # both causal, in pages of 16 tokens; a row shares its prompt once its first round has run
        self.prefix = PrefixStore(ctx.prefix_bytes, 16) if ctx.prefix_bytes else None
        self._layers = {"k": self.model.config.num_layers, "v": self.model.config.num_layers,
                        "dk": c.num_layers, "dv": c.num_layers}

    def prepare(self, params) -> None:
        if params.min_tokens:
            raise UnmaskError(f"min_tokens {params.min_tokens}: speculative rows verify the drafter's tokens as the "
                              "target proposes them; they take no minimum length", param="min_tokens")
        return None

    # --- rows ------------------------------------------------------------------------------------
    def admit(self, reqs: list) -> None:
        r = self.rows
        r.grow(max(len(q.prompt) + q.params.gen_length + self.B for q in reqs))
        x = torch.full((len(reqs), r.cap + 1), r.pad_id, dtype=torch.long)
        for i, q in enumerate(reqs):
            x[i, : len(q.prompt)] = torch.tensor(q.prompt)
        lens = [len(q.prompt) for q in reqs]
        r.append(reqs, {"x": x, "P": lens, "G": [q.params.gen_length for q in reqs], "ver": lens, "dlen": 0,
                        "new": True, "early": [q.params.early_stop for q in reqs],
                        "temp": [float(q.params.temperature) for q in reqs], "pc": lens})
        if self.prefix is not None:
            self._reuse(reqs, r.n - len(reqs))
        self.sampling += sum(q.params.temperature > 0 for q in reqs)
        self.watching += sum(q.watch for q in reqs)
        self.constrained += sum(q.grammar is not None for q in reqs)
        self.logprobs.admit(reqs)

    def _reuse(self, reqs: list, first: int) -> None:
        """Joining rows (from row `first`) take their prompts' cached prefixes: the target's K/V
        and the drafter's context of [0, m), so their prefill computes [m, P) and the drafter
        reads the features of [m, P) only. The last prompt column is always computed (its
        logits give the first token)."""
        r, store = self.rows, self.prefix
        for j, q in enumerate(reqs, first):
            m, slots = store.lookup(q, len(q.prompt) - 1)
            if not m:
                continue
            store.load({name: r.layer_buffers(name, self._layers[name], pool[0]) for name, pool in store.pools.items()},
                       j, slots)
            r.reused[j], r.dlen[j], r.pc[j] = m, m, len(q.prompt) - m

    def _share(self, report: Report) -> None:
        """Rows whose first round ran: their prompts' pages (both caches final there) join the
        prefix cache; a row that ended at its prefill shares nothing (no drafter context)."""
        r = self.rows
        for i, stats in zip(report.rows, report.stats):
            if stats.draft_forwards:
                self.prefix.share(r.reqs[i], {name: getattr(r, name) for name in self._layers}, i)
            else:
                self.prefix.final(r.reqs[i])

    def remove(self, gone: list[int]) -> None:
        if self.prefix is not None:
            self.prefix.forget([self.rows.reqs[i] for i in gone])
        self.sampling -= sum(self.rows.reqs[i].params.temperature > 0 for i in gone)
        self.constrained -= sum(self.rows.reqs[i].grammar is not None for i in gone)
        self.watching -= sum(self.rows.reqs[i].watch for i in gone)
        self.logprobs.remove([self.rows.reqs[i] for i in gone])
        self.rows.remove(gone)

    # --- one step --------------------------------------------------------------------------------
    def cost(self) -> Cost:
        r = self.rows
        return Cost(torch.where(r.new, r.P - r.reused, 0) + r.pc + 2 * self.B, r.seq)

    def decode(self, run: torch.Tensor) -> Report:
        r, dev = self.rows, self.device
        report = Report()
        old = r.ver.clone()  # verified length before the step
        fresh = run & r.new
        idx, n_fresh = run.nonzero().squeeze(-1), int(fresh.sum())
        pre = None
        if n_fresh:
            pre = self._prefill(fresh.nonzero().squeeze(-1))
            report.records.append(pre)
            # a row whose first token ends it (an end of text, or gen_length 1) takes no block
            first = r.x.gather(1, r.P[:, None])[:, 0]
            ended = fresh & ((torch.isin(first, self.stop_ids) & r.early) | (r.G <= 1))
            idx = (run & ~ended).nonzero().squeeze(-1)
        rounds = torch.zeros(r.n, dtype=torch.long, device=dev)
        gained = torch.zeros(r.n, dtype=torch.long, device=dev)
        if idx.numel():
            rnd = self._round(idx, gained)
            report.records += rnd
            rounds[idx] = 1
        self._report(run, fresh, rounds, gained, old, report, pre, report.records[-1] if idx.numel() else None)
        self.logprobs.attach(report)
        if self.prefix is not None and self.prefix.waiting:
            self._share(report)
        return report

    def _prefill(self, idx: torch.Tensor) -> ForwardRecord:
        """Run the target over rows `idx`' prompts (from the end of a reused prefix, against its
        K/V); take each row's first output token."""
        t0, r = time.perf_counter(), self.rows
        k = idx.numel()
        P = r.P[idx]
        S = r.reused[idx]
        if self.prefix is not None and bool(S.any()):  # some rows reuse a cached prefix
            Q = P - S
            ar = torch.arange(int(Q.max()), device=self.device)[None, :]
            real = ar < Q[:, None]
            cols = torch.where(real, S[:, None] + ar, r.cap)
            keys = torch.arange(r.cap + 1, device=self.device)[None, :] < P[:, None]  # its prompt's columns
            kv = RowsKV(r, idx, cols, False, r.num_layers)
            logits, feats = self.model(r.x[idx].gather(1, cols), torch.where(real, cols, 0), kv, S, keys,
                                       (Q - 1)[:, None], capture=self.layers)
            n_pos = float(Q.sum())
        else:  # no row reuses: one forward over the prompts alone
            Pmax = int(P.max())
            cols = torch.arange(Pmax, device=self.device)[None, :].expand(k, -1)
            real = cols < P[:, None]
            kv = RowsKV(r, idx, torch.where(real, cols, r.cap), True, r.num_layers)
            logits, feats = self.model(r.x[idx, :Pmax], cols, kv, 0, None if bool(real.all()) else real,
                                       (P - 1)[:, None], capture=self.layers)
            n_pos = float(P.sum())
        r.put_pend(idx, torch.where(real[..., None], feats, 0))
        tokens = self._choose(logits, idx)  # (k, 1)
        if self.constrained:
            self._constrain(idx, logits, None, tokens, None)
        r.x[idx] = r.x[idx].scatter(1, P[:, None], tokens)
        self.logprobs.record(idx, P[:, None], logits, tokens, torch.ones_like(tokens, dtype=torch.bool))
        r.ver[idx] = P + 1
        r.new[idx] = False
        return ForwardRecord("full", k, n_pos / k, k, time.perf_counter() - t0)

    def _round(self, idx: torch.Tensor, gained_out: torch.Tensor) -> list[ForwardRecord]:
        """One draft forward and one verify forward over rows `idx`."""
        r, B, dev = self.rows, self.B, self.device
        n = idx.numel()
        every = n == r.n
        sub = None if every else idx
        t0 = time.perf_counter()
        ver, dlen, pc = (r.ver, r.dlen, r.pc) if every else (r.ver[idx], r.dlen[idx], r.pc[idx])
        start = ver - 1  # the last verified token: the block's first position, not yet in the target's cache
        ar = torch.arange(B, device=dev)[None, :]
        block = torch.full((n, B), self.mask, dtype=torch.long, device=dev)
        x = r.x if every else r.x[idx]
        block[:, 0] = x.gather(1, start[:, None])[:, 0]
        bpos = start[:, None] + ar
        pend = r.pend if every else r.pend[idx]
        w = pend.shape[1]
        aw = torch.arange(w, device=dev)[None, :]
        cols = torch.where(aw < pc[:, None], dlen[:, None] + aw, r.cap)
        keys = torch.arange(r.cap + 1, device=dev)[None, :] < (dlen + pc)[:, None]
        mask = torch.cat([keys, torch.ones(n, B, dtype=torch.bool, device=dev)], 1)[:, None, None, :]
        hidden = self.drafter(self.model.embed(block), pend, torch.cat([dlen[:, None] + aw, bpos], 1),
                              DraftKV(r, cols, sub), mask)
        block[:, 1:] = self.model.head(hidden[:, 1:]).argmax(-1)
        if every:
            r.dlen = dlen + pc
        else:
            r.dlen[idx] = dlen + pc
        t1 = time.perf_counter()
        kv = RowsKV(r, sub, bpos, False, r.num_layers)
        key_mask = torch.arange(r.cap + 1, device=dev)[None, :] < (start + B)[:, None]
        logits, feats = self.model(block, bpos, kv, start, key_mask, None, capture=self.layers)
        choice = self._choose(logits, idx)  # (n, B): the target's token after each block position
        accepted = (block[:, 1:] == choice[:, :-1]).long().cumprod(1).sum(1)  # drafts kept
        gained = accepted + 1  # and the target's own next token
        if self.constrained:
            self._constrain(idx, logits, block, choice, gained)
        ok = ar < gained[:, None]
        x = x.scatter(1, torch.where(ok, ver[:, None] + ar, r.cap), choice)
        self.logprobs.record(idx, (ver[:, None] + ar).clamp(max=r.cap), logits, choice, ok)
        if every:
            r.x, r.ver, r.pc = x, ver + gained, gained
        else:
            r.x[idx], r.ver[idx], r.pc[idx] = x, ver + gained, gained
        r.put_pend(sub, feats)
        gained_out[idx] = gained
        t2 = time.perf_counter()
        return [ForwardRecord("draft", n, float(B + w), 0, t1 - t0), ForwardRecord("verify", n, float(B), 0, t2 - t1)]

    def _constrain(self, idx: torch.Tensor, logits: torch.Tensor, block, choice: torch.Tensor, gained) -> None:
        """Constrained rows among `idx`: their tokens from RowGrammar.verify, written into `choice`
        ((n, k)) and their counts into `gained` (None for the prefill's one token)."""
        r = self.rows
        rows = idx.tolist()
        ks = [k for k, row in enumerate(rows) if r.reqs[row].grammar is not None]
        if not ks:
            return
        sel = torch.tensor(ks, device=idx.device)
        done = (r.ver[idx[sel]] - r.P[idx[sel]]).tolist()  # tokens written before the block
        drafts = block[sel, 1:].tolist() if block is not None else [[] for _ in ks]
        for k, d, before in zip(ks, drafts, done):
            req = r.reqs[rows[k]]
            toks = req.grammar.verify(logits[k], d, req.params.gen_length - before)
            choice[k, : len(toks)] = torch.tensor(toks, device=choice.device)
            if gained is not None:
                gained[k] = len(toks)

    def _choose(self, logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The target's token at every position: argmax, or for rows with a temperature a sample
        from softmax(logits / T), drawn from the row's own generator when it has a seed (alone,
        in order), else together from torch's global generator (engine/draws.py)."""
        out = logits.argmax(-1)
        if not self.sampling:
            return out
        temp = self.rows.temp[idx]
        probs = torch.softmax(logits.float() / temp.clamp(min=1e-5)[:, None, None], -1)
        V = probs.shape[-1]
        drawn = self.draws.draw(
            idx.numel(), self.draws.seeded(self.rows.reqs, idx),
            lambda sel: torch.multinomial((probs if sel is None else probs[sel]).reshape(-1, V), 1).view(
                -1, probs.shape[1]),
            lambda k, g: torch.multinomial(probs[k], 1, generator=g)[:, 0])
        return torch.where((temp > 0)[:, None], drawn, out)

    def _report(self, run, fresh, rounds, gained, old, report: Report, pre, verify) -> None:
        """Each running row's new tokens (cut after an end of text or at gen_length), in one transfer."""
        r, dev = self.rows, self.device
        idx = run.nonzero().squeeze(-1)
        W = self.B + 1
        ar = torch.arange(W, device=dev)[None, :]
        o, v = old[idx], r.ver[idx]
        cols = (o[:, None] + ar).clamp(max=r.cap)
        valid = ar < (v - o)[:, None]
        toks = r.x[idx].gather(1, cols)
        is_stop = torch.isin(toks, self.stop_ids) & valid & r.early[idx, None]
        stop_at = torch.where(is_stop.any(1), is_stop.float().argmax(1) + 1, v - o)  # tokens kept, up to a stop
        room = r.G[idx] - (o - r.P[idx])  # tokens the row may still take
        kept = torch.minimum(stop_at, room)
        finished = is_stop.any(1) | (kept >= room)
        host = torch.cat([toks, torch.stack([kept, finished.long(), fresh[idx].long(), rounds[idx], gained[idx],
                                             o - r.P[idx]], 1)], 1).tolist()
        rows = idx.tolist()
        done = [i for i, row in zip(rows, host) if row[W + 1]]
        watched = [i for i in rows if r.reqs[i].watch] if self.watching else []
        shown = sorted(set(done) | set(watched))
        answers = dict(zip(shown, r.x[shown].tolist())) if shown else {}
        total = 0
        for i, row in zip(rows, host):
            kp, fin, fr, rd, g, before = row[W:]
            new_ids = row[:kp]
            total += kp
            drafted = self.B - 1 if rd else 0
            report.row(i, before + kp, new_ids, fr + rd, [1] * fr + [g] * rd, bool(fin),
                       SpecStats(rd, drafted, g - 1 if rd else 0))
            if i in answers:
                P = len(r.reqs[i].prompt)
                answer = answers[i][P : P + before + kp]
                if fin:
                    report.answers[i] = answer
                if r.reqs[i].watch:  # the playground: the whole answer so far (every token of it is final)
                    report.views[i] = (answer, None, None)
        if verify is not None:
            verify.committed = total - (pre.rows if pre is not None else 0)
