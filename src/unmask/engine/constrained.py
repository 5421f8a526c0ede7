"""Structured output for masked rows: the grammar at each constrained row's frontier.

A constrained row (a request with a RowGrammar, unmask.constrain) decodes as any masked row —
its commit policy, cache and blocks unchanged — with three additions per forward:
1. `before` (ahead of the proposals): the logits at the row's frontier (its first position not
   yet checked) keep only the tokens the grammar allows after the validated prefix (so the
   frontier's confidence is the model's, renormalised over what the grammar allows), and the
   next masked positions keep what the grammar allows after the likeliest allowed tokens before
   them (`_chain`); a revising policy may not edit or remask the validated prefix;
2. the commit as usual, by the row's own policy: tokens right of the frontier are the model's
   own, unchecked yet;
3. `after`: the committed run from the frontier is checked (RowGrammar.advance): accepted tokens
   move the frontier, the first rejected one is masked again (the model proposes it anew at the
   next step, then under the grammar's mask), and the frontier's token is replaced by the
   grammar's plan when it would leave no room to finish. Once the grammar accepts an end of text,
   the rest of the answer is end of text.
A block is left only when all its positions are committed, and every committed position of it
has then been checked, so nothing outside the open block is ever changed (caches stay exact).

Decoding ends: every forward commits at least one masked position of the block (the policies'
rule); a token is masked again only when the frontier reaches it, so each forward either moves
the frontier or commits a position right of it, and once the block is full but for the
frontier, the next forward commits the frontier: at most 2 x block_length forwards per block
(plus a revising policy's post steps).

The grammar work is on the host, row by row (llguidance); the tensor work is one masked fill
and one scatter per forward, over the constrained rows only."""

import torch

from unmask.engine.rows import RowState

CHAIN = 16  # positions from the frontier masked along the likeliest continuation (Constrained._chain)


class Constrained:
    def __init__(self, rows: RowState, mask_id: int, eos: int) -> None:
        self.rows, self.mask, self.eos = rows, mask_id, eos
        self.count = 0  # running constrained rows (nothing is done while there are none)
        self._seen = None  # (idx, rows) of the forward `before` saw, for its `after`

    def admit(self, req) -> None:
        if req.grammar is not None:
            req.grammar.front = len(req.prompt)
            self.count += 1

    def remove(self, req) -> None:
        self.count -= req.grammar is not None

    def _rows(self, idx: torch.Tensor, finished: bool = False) -> list[tuple[int, object, int, int]]:
        """(position in idx, grammar, the open block's start and end) of the constrained rows in
        `idx` (with `finished`, those whose grammar has accepted an end of text too)."""
        r = self.rows
        rows = idx.tolist()
        picked = [(k, row) for k, row in enumerate(rows)
                  if r.reqs[row].grammar is not None and (finished or not r.reqs[row].grammar.finished)]
        if not picked:
            return []
        sel = torch.tensor([row for _, row in picked], device=r.device)
        bounds = torch.stack([r.s[sel], r.e[sel]], 1).tolist()
        return [(k, r.reqs[row].grammar, s, e) for (k, row), (s, e) in zip(picked, bounds)]

    def before(self, idx: torch.Tensor, logits: torch.Tensor, W: int) -> torch.Tensor | None:
        """Mask the logits in place at each constrained row's frontier and along its likeliest
        continuation (`_chain`); returns the (B, W) bool lock (each constrained row's validated
        columns, for a revising policy), or None."""
        self._seen = None
        if not self.count:
            return None
        every = self._rows(idx, finished=True)
        self._seen = (idx, every)  # `after` checks the same rows (one read of them per forward)
        if not every:
            return None
        dev, B = logits.device, idx.numel()
        lock = torch.zeros(B, W, dtype=torch.bool, device=dev)  # the validated prefix (all of a finished one)
        k = torch.tensor([k for k, *_ in every], device=dev)
        upto = torch.tensor([(e if g.finished else g.front) - s for _, g, s, e in every], device=dev)
        lock[k] = torch.arange(W, device=dev)[None, :] < upto[:, None]
        # a revising policy's post steps keep a block open after its last mask: no frontier in it
        rows = [row for row in every if not row[1].finished and row[1].front < row[3]]
        if rows:
            self._chain(idx, logits, rows)
        return lock

    def _chain(self, idx: torch.Tensor, logits: torch.Tensor, rows: list) -> None:
        """The grammar's masks along each row's likeliest continuation: at the frontier, the mask
        of the validated prefix; at the next masked positions, the mask after the argmax of the
        allowed tokens at the positions before (a committed token there is taken as it is), up to
        `CHAIN` positions, the block's end, an end of text or a token the grammar rejects. So a
        forward's proposals right of the frontier are consistent with what it proposes before
        them (the pairs task's "high" is followed by "card", not "house"), and more of them
        survive the check. Positions are done together across rows: one bitmask fill and one
        read of the argmaxes per chain position."""
        r, dev = self.rows, logits.device
        vocab = rows[0][1].vocab
        stop = set(vocab.stop)
        sel = idx[torch.tensor([k for k, *_ in rows], device=idx.device)]
        canvas = r.x[sel].tolist()
        depth = [0] * len(rows)  # tokens each row's matcher consumed along its chain (rolled back below)
        live = list(range(len(rows)))
        try:
            for step in range(CHAIN):
                want = []  # (row j, column) of the masked positions to mask at this step
                for j in live:
                    _, g, s, e = rows[j]
                    c = g.front + step
                    if c >= e:
                        continue
                    t = canvas[j][c]
                    if t == self.mask:
                        want.append((j, c))
                    elif t not in stop and t < vocab.n_text and g.m.try_consume_tokens([t]) == 1:
                        depth[j] += 1  # a committed token the grammar takes: the chain goes on past it
                        want.append((j, None))
                if not want:
                    break
                masked = [(j, c) for j, c in want if c is not None]
                live = [j for j, c in want if c is None]
                if not masked:
                    continue
                bitmask = vocab.bitmask(len(masked))
                vocab.fill([rows[j][1].m for j, _ in masked], bitmask)
                allowed = vocab.unpack(bitmask, logits.shape[-1]).to(dev)
                k = torch.tensor([rows[j][0] for j, _ in masked], device=dev)
                w = torch.tensor([c - rows[j][2] for j, c in masked], device=dev)
                chosen = logits[k, w].masked_fill(~allowed, -torch.inf)
                logits[k, w] = chosen
                if step + 1 < CHAIN:
                    for (j, _), t in zip(masked, chosen.argmax(-1).tolist()):
                        if t not in stop and rows[j][1].m.try_consume_tokens([t]) == 1:
                            depth[j] += 1
                            live.append(j)
        finally:
            for (_, g, _, _), n in zip(rows, depth):
                if n:
                    g.m.rollback(n)

    def after(self, idx: torch.Tensor) -> None:
        """Check what the forward committed from each constrained row's frontier (see above)."""
        if not self.count:
            return
        seen, self._seen = self._seen, None
        rows = [row for row in seen[1] if not row[1].finished] if seen is not None and seen[0] is idx \
            else self._rows(idx)
        if not rows:
            return
        r = self.rows
        sel = idx[torch.tensor([k for k, *_ in rows], device=idx.device)]
        x = r.x[sel]
        ends = r.L[sel].tolist()
        canvas = x.tolist()
        wr, wc, wv = [], [], []
        for j, ((_, g, _, _), row, L) in enumerate(zip(rows, canvas, ends)):
            f = g.front
            run = []
            while f + len(run) < L and row[f + len(run)] != self.mask:
                run.append(row[f + len(run)])
            keep, remask = g.advance(run, L - f)
            for i, t in enumerate(keep):
                if t != row[f + i]:
                    wr.append(j), wc.append(f + i), wv.append(t)
            g.front = f + len(keep)
            if remask:
                wr.append(j), wc.append(g.front), wv.append(self.mask)
            if g.finished:  # the answer ended: end of text to the end of its canvas
                for c in range(g.front, L):
                    if row[c] != self.eos:
                        wr.append(j), wc.append(c), wv.append(self.eos)
        if wr:
            dev = x.device
            x[torch.tensor(wr, device=dev), torch.tensor(wc, device=dev)] = torch.tensor(wv, device=dev, dtype=x.dtype)
            r.x[sel] = x
