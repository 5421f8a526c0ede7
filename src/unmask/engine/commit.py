"""One forward's decisions for its rows: proposals, what each row's commit policy commits, the
cache policy's doubt about a cached step, and the write into the canvases."""

from dataclasses import dataclass

import torch

from unmask.engine.draws import Draws
from unmask.engine.parts import DecodeParts
from unmask.engine.rows import RowState
from unmask.sampler.policy import Revision
from unmask.sampler.proposal import propose, token_prob


@dataclass
class Committed:
    """What one forward committed, for rows `idx` (all (B, ...) in idx order)."""

    idx: torch.Tensor
    counts: torch.Tensor  # (B,) tokens committed per row
    doubted: torch.Tensor | None  # (B,) the row's cache doubted this cached step (it committed nothing)
    commit: torch.Tensor  # (B, W) committed block columns
    tokens: torch.Tensor  # (B, W) proposals
    candidates: torch.Tensor  # (B, W) masked block columns before the commit
    edits: torch.Tensor | None = None  # (B,) committed tokens replaced (revising policies), or None
    remasked: torch.Tensor | None = None  # (B,) committed tokens masked again


class Committer:
    def __init__(self, rows: RowState, parts: dict[int, DecodeParts], mask_id: int, draws: Draws,
                 tp=None, vocab: int = 0) -> None:
        """`tp`: the model's tensor-parallel group; the logits are then this rank's vocabulary slice."""
        self.rows, self.parts, self.mask, self.draws = rows, parts, mask_id, draws
        self.tp, self.vocab = tp, vocab
        # watched rows (the playground): row -> {answer position: the token proposed there}, this
        # step's last forward; the step's report takes them (postprocess.report)
        self.shown: dict[int, dict[int, int]] = {}

    def commit(self, idx: torch.Tensor, logits: torch.Tensor, s: torch.Tensor, W: int, verify: bool,
               watching: bool, lock: torch.Tensor | None = None) -> Committed:
        """Propose, select and write for rows `idx`, one call per distinct setting among the
        running rows (a few groups, not one per row). With `verify` (the step's first cached
        window) a cache policy that verifies may doubt its rows' step: they commit nothing here and
        the step recomputes them. `lock` ((B, W) bool, structured output's rows,
        engine/constrained.py): committed columns a revising policy may not change."""
        r = self.rows
        ar = torch.arange(W, device=r.device)[None, :]
        valid = ar < (r.e - s)[idx, None]
        cols = torch.where(valid, s[idx, None] + ar, r.cap)
        x = r.x[idx]
        cand = (x.gather(1, cols) == self.mask) & valid
        if any(r.mins):  # min_tokens: no end-of-text proposed before each row's minimum length
            logits = self._hold_stops(logits, cols < r.minl[idx, None])
        tokens = torch.zeros_like(cols)
        commit = torch.zeros_like(cand)
        edit = remask = None
        doubt = torch.zeros(idx.numel(), dtype=torch.bool, device=r.device)
        cfgs = r.cfg[idx]
        distinct = r.distinct
        for cfg in distinct:
            if len(distinct) == 1:  # one setting (the usual case): every row, no index to compute
                sel = torch.arange(idx.numel(), device=r.device)
            else:
                sel = (cfgs == cfg).nonzero().squeeze(-1)
                if sel.numel() == 0:
                    continue
            parts = self.parts[cfg]
            tok, score, ent = self._propose(parts, idx[sel], logits[sel])
            quota = None
            if parts.policy.uses_schedule:
                q = r.quota[idx[sel]].gather(1, r.step[idx[sel], None].clamp(max=r.quota.shape[1] - 1)).squeeze(1)
                over = r.step[idx[sel]] >= r.spb[idx[sel]]  # a quota could not be met: finish the block
                quota = torch.where(over, cand[sel].sum(-1), q)
            # native policies ignore the step index (only Dream's compat policy reads it)
            c = parts.policy.select(score, ent, cand[sel], quota, 0, None) & cand[sel]
            if verify and parts.cache.verifies:  # the probability of each proposed token
                doubt[sel] = parts.cache.doubts(token_prob(logits[sel], tok, self.tp, self.vocab), c)
            tokens[sel], commit[sel] = tok, c
            if parts.policy.revises:  # the policy may also revise the block's committed tokens
                if edit is None:
                    edit, remask, prob_all = (torch.zeros_like(cand), torch.zeros_like(cand),
                                              torch.zeros(cand.shape, device=cand.device))
                prob = token_prob(logits[sel], tok, self.tp, self.vocab)
                prob_all[sel] = prob
                editable = valid[sel] & ~cand[sel]
                if lock is not None:
                    editable = editable & ~lock[sel]
                rows = idx[sel]
                rev = Revision(prob, tok, x[sel].gather(1, cols[sel]), editable, c, r.step[rows], r.spb[rows],
                               r.conf[rows].gather(1, cols[sel]),
                               self._uniform(rows, editable.shape) if parts.policy.needs_uniform else None)
                ed, rm = parts.policy.revise(rev)
                if ed is not None:
                    edit[sel] = ed & editable
                if rm is not None:
                    remask[sel] = rm & editable & ~edit[sel]
        if watching:
            self._show(idx, s, cols, cand & ~commit, tokens)
        if verify:
            commit = commit & ~doubt[:, None]
        write = commit
        if edit is not None:
            if verify:
                edit, remask = edit & ~doubt[:, None], remask & ~doubt[:, None]
            write = commit | edit
        new = torch.where(write, tokens, x.gather(1, cols))
        if edit is not None:
            new = torch.where(remask, self.mask, new)
        x.scatter_(1, cols, new)
        x[:, r.cap] = r.pad_id
        r.x[idx] = x
        if edit is not None:  # what each written token's probability was (ReMDM's conf strategy reads it)
            conf = r.conf[idx]
            conf.scatter_(1, cols, torch.where(write, prob_all, conf.gather(1, cols)))
            r.conf[idx] = conf
        return Committed(idx, commit.sum(-1), doubt if verify else None, commit, tokens, cand,
                         None if edit is None else edit.sum(-1), None if edit is None else remask.sum(-1))

    def _hold_stops(self, logits: torch.Tensor, early: torch.Tensor) -> torch.Tensor:
        """The logits with every end-of-text id at -inf at the (B, W) `early` columns (this
        rank's vocabulary slice under tensor parallelism)."""
        stops = self.rows.stop_ids
        if self.tp is not None:  # ids of this rank's slice, shifted into it
            lo, hi = self.tp.vocab_range(self.vocab)
            stops = stops[(stops >= lo) & (stops < hi)] - lo
        held = logits.clone()
        held[..., stops] = held[..., stops].masked_fill(early[..., None], -torch.inf)
        return held

    def _uniform(self, rows: torch.Tensor, shape) -> torch.Tensor:
        """U(0, 1) draws for a revising policy (engine/draws.py: seeded rows alone)."""
        dev = self.rows.device
        return self.draws.draw(shape[0], self.draws.seeded(self.rows.reqs, rows),
                               lambda sel: torch.rand(shape if sel is None else (sel.numel(), shape[1]), device=dev),
                               lambda k, g: torch.rand(shape[1], generator=g, device=g.device))

    def _show(self, idx, s, cols, still_open, tokens) -> None:
        """The playground's view of watched rows: what each open position would become this step."""
        r = self.rows
        watched = [i for i, row in enumerate(idx.tolist()) if r.reqs[row].watch]
        if not watched:
            return
        open_ = still_open[watched].tolist()
        props, where = tokens[watched].tolist(), (cols[watched] - s[idx[watched], None]).tolist()
        for k, i in enumerate(watched):
            base = int(s[idx[i]]) - int(r.P[idx[i]])
            self.shown[int(idx[i])] = {base + w: t for w, t, o in zip(where[k], props[k], open_[k]) if o}

    def _propose(self, parts: DecodeParts, idx: torch.Tensor, logits: torch.Tensor):
        """Proposals for rows of one setting in one batched call, except that a row with its own
        random generator (a seed, with sampling or random order) draws alone, from its own
        generator and in its own shape, so its draws do not depend on the other rows."""
        cfg = parts.proposal
        sampled = cfg.temperature > 0 or cfg.confidence == "random"
        seeded = self.draws.seeded(self.rows.reqs, idx) if sampled else []
        if not seeded:
            p = propose(logits, cfg, None, self.tp, self.vocab)
            return p.tokens, p.score, p.entropy
        own = {k for k, _ in seeded}
        shared = [k for k in range(idx.numel()) if k not in own]
        width = (self.rows.e - self.rows.s)[idx].tolist()
        W = logits.shape[1]
        pad = lambda t, v: torch.nn.functional.pad(t, (0, W - t.shape[1]), value=v)  # noqa: E731
        parts_out = []
        if shared:
            sel = torch.tensor(shared, dtype=torch.long, device=logits.device)
            parts_out.append((sel, propose(logits[sel], cfg, None, self.tp, self.vocab)))
        for k, g in seeded:
            one = propose(logits[k : k + 1, : width[k]], cfg, g, self.tp, self.vocab)
            parts_out.append((torch.tensor([k], device=logits.device), one))
        first = parts_out[0][1]
        tokens = torch.full((idx.numel(), W), self.mask, dtype=torch.long, device=logits.device)
        score = torch.full((idx.numel(), W), -torch.inf, dtype=first.score.dtype, device=logits.device)
        ent = None
        for sel, p in parts_out:
            tokens[sel] = pad(p.tokens, self.mask)
            score[sel] = pad(p.score, -torch.inf)
            if p.entropy is not None:
                if ent is None:
                    ent = torch.full((idx.numel(), W), torch.inf, dtype=p.entropy.dtype, device=logits.device)
                ent[sel] = pad(p.entropy, torch.inf)
        return tokens, score, ent
