"""Commit-time diagnostics (seed 004 §14, algorithm 4): at every step of a cached decode, an
uncached forward over the same canvas observes what the cache changed. The observer never
changes the decode: the fresh forward writes no KV, and the fresh proposal is greedy (it draws no
random numbers), so the cached run's tokens equal those of the same decode without it.

Per committed position: the cache's age (steps since the row's last full forward), the tokens
the row committed since that forward (what the cached K/V do not know about), the position in
its block, the distance to the nearest position still open after the commit, the cached and
fresh confidence (probability of the committed token), the cached margin (top-1 minus top-2
probability) and entropy (the other two commit scores, for their calibration), whether the fresh forward's top token is
the committed one, and KL(fresh ‖ cached) of the two predictive distributions. Per cached step
and row: the relative drift of each layer's cached keys and values against the fresh ones.
"""

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class CommitRecord:
    request: str
    block: int
    step: int  # the row's step inside its block
    position: int  # position in the answer
    token: int  # the committed token
    in_block: int  # position inside its block
    cache_age: int  # steps since the row's last full forward (0: this forward was exact)
    since_refresh: int  # tokens the row committed after its last full forward, before this step
    distance_to_open: int  # to the nearest position still masked after this step (-1: none)
    cached_conf: float
    fresh_conf: float
    cached_margin: float  # top-1 minus top-2 probability of the cached forward
    cached_entropy: float  # entropy (nats) of the cached predictive distribution
    agree: bool  # the fresh forward's top token is the committed token
    kl: float  # KL(fresh || cached) at this position


@dataclass
class DriftRecord:
    request: str
    block: int
    step: int
    cache_age: int
    key_drift: list[float]  # per layer: ||K_cached - K_fresh|| / ||K_fresh|| over the canvas
    value_drift: list[float]


@dataclass
class Observer:
    commits: list[CommitRecord] = field(default_factory=list)
    drift: list[DriftRecord] = field(default_factory=list)
    _age: dict[str, int] = field(default_factory=dict)
    _since: dict[str, int] = field(default_factory=dict)

    def observe(self, engine, kind: str, idx: torch.Tensor, s: torch.Tensor, W: int, logits: torch.Tensor,
                fresh, done) -> None:
        """One forward of the engine's step: its cached logits, the fresh forward's (logits and the
        recorder of fresh K/V), and what it committed (unmask.engine.commit.Committed)."""
        fresh_logits, rec = fresh
        commit, tokens, cand = done.commit, done.tokens, done.candidates
        r = engine.rows
        lp_c = torch.log_softmax(logits.float(), -1)
        lp_f = torch.log_softmax(fresh_logits.float(), -1)
        kl = (lp_f.exp() * (lp_f - lp_c)).sum(-1)  # (B, W)
        conf_c = lp_c.gather(-1, tokens[..., None]).squeeze(-1).exp()
        conf_f = lp_f.gather(-1, tokens[..., None]).squeeze(-1).exp()
        top2 = lp_c.topk(2, -1).values.exp()
        margin = top2[..., 0] - top2[..., 1]
        entropy = -(lp_c.exp() * lp_c).sum(-1)
        agree = fresh_logits.argmax(-1) == tokens
        still_open = cand & ~commit
        data = [t.tolist() for t in (commit, still_open, conf_c, conf_f, agree, kl, margin, entropy)]
        toks = tokens.tolist()
        rows, blocks, steps = idx.tolist(), r.block[idx].tolist(), r.step[idx].tolist()
        blk, first = (r.e - r.s)[idx].tolist(), (r.s - r.P)[idx].tolist()
        for b, (row, block, step) in enumerate(zip(rows, blocks, steps)):
            req = r.reqs[row]
            age = 0 if kind == "full" else self._age.get(req.id, 0) + 1
            self._age[req.id] = age
            since = 0 if kind == "full" else self._since.get(req.id, 0)
            self._since[req.id] = since + sum(data[0][b][: blk[b]])
            open_cols = [w for w, o in enumerate(data[1][b]) if o]
            for w in range(blk[b]):
                if not data[0][b][w]:
                    continue
                dist = min((abs(w - j) for j in open_cols), default=-1)
                self.commits.append(CommitRecord(req.id, block, step, first[b] + w, toks[b][w], w, age, since, dist,
                                                 data[2][b][w], data[3][b][w], data[6][b][w],
                                                 max(0.0, data[7][b][w]), bool(data[4][b][w]),
                                                 max(0.0, data[5][b][w])))
            if kind == "window" and r.k is not None:
                L = int(r.T[row])
                kd = [_rel(r.k[layer][row, :, :L], rec.k[layer][b, :, :L]) for layer in sorted(rec.k)]
                vd = [_rel(r.v[layer][row, :, :L], rec.v[layer][b, :, :L]) for layer in sorted(rec.v)]
                self.drift.append(DriftRecord(req.id, block, step, age, kd, vd))

    def to_json(self) -> dict:
        return {"commits": [asdict(c) for c in self.commits], "drift": [asdict(d) for d in self.drift]}


def _rel(cached: torch.Tensor, fresh: torch.Tensor) -> float:
    return float((cached.float() - fresh.float()).norm() / fresh.float().norm().clamp_min(1e-12))
