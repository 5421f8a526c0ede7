"""A hole decoded at several lengths, the fill most like the others kept (`hole_length` "consensus";
minimum Bayes risk over lengths, training-free: issue 47, docs/infilling.md).

A model trained on exact-length spans fills every mask it is given, so a hole's length decides its
text. When the caller gives only a bound, the engine decodes the hole once per candidate length —
`hole_candidates` lengths spread geometrically from an eighth of the bound (or min_tokens) to the
bound: a prior that the middle is within a factor of eight of the bound, uniform in log-length
(chosen on held-out code holes: from one token, single-line holes gained and multi-line ones lost;
from half the bound, both lost) — each candidate an exact hole of its own (a row of the batch like
any other: they decode together, in the same batched forwards; each computes its own K/V, the
prompt's included), and answers with the candidate whose text is, summed over the others, most
similar to them (difflib's ratio on token ids): the fill the lengths agree on. The request streams
nothing until every candidate is done; its forwards are those any candidate took part in (the
batched forwards it waited for), its commits those of the candidate kept, its counters the
candidates' summed. A watched request (the playground) shows its longest candidate's canvas — the
whole hole at the bound — as it fills, and at the end the kept candidate's.

The engine owns the request table; this class owns the candidates of each consensus request
(`Consensus.split` makes them, `Consensus.report` folds their step outputs into their request's)."""

import difflib
import math
from dataclasses import dataclass, field

from unmask.engine.request import Request, Status, StepOutput
from unmask.sampler.stops import first_stop_index

SHORTEST = 8  # the shortest candidate is an eighth of the bound


def lengths(bound: int, k: int, least: int = 1) -> list[int]:
    """`k` candidate lengths spread geometrically over [max(least, bound / SHORTEST), bound],
    rounded, distinct (every length of the range when it holds no more than `k`)."""
    least = max(1, min(max(least, math.ceil(bound / SHORTEST)), bound))
    if k <= 1:
        return [bound]
    if bound - least < k:
        return list(range(least, bound + 1))
    ratio = bound / least
    return sorted({min(bound, max(least, round(least * ratio ** (i / (k - 1))))) for i in range(k)})


def choose(answers: list[list[int]]) -> int:
    """The index of the answer with the largest summed similarity to all of them (itself
    included, the same for every one); ties go to the first (the shortest length)."""
    score = [0.0] * len(answers)
    for i in range(len(answers)):
        for j in range(i + 1, len(answers)):
            s = difflib.SequenceMatcher(None, answers[i], answers[j], autojunk=False).ratio()
            score[i] += s
            score[j] += s
    return max(range(len(answers)), key=lambda i: (score[i], -i))


@dataclass
class Group:
    """One consensus request and its candidates (a row each)."""

    request: Request
    candidates: list[Request]
    streamed: dict[str, list[int]] = field(default_factory=dict)  # each candidate's committed ids so far
    live: int = 0  # candidates not yet finished


class Consensus:
    """The consensus requests in flight, found by their candidates' ids."""

    def __init__(self, stop: set[int]) -> None:
        self.stop = stop  # end-of-text ids: a candidate's text ends at its first
        self.of: dict[str, Group] = {}  # candidate id -> its group
        self.groups: dict[str, Group] = {}  # request id -> its group

    @staticmethod
    def wants(params, suffix, fill=None) -> bool:
        """Is this request a hole to decode at several lengths (a suffix, one hole)?"""
        return params.hole_length == "consensus" and bool(suffix) and fill is None

    @staticmethod
    def rows(params, suffix, fill=None) -> int:
        """The rows a request takes: its candidates, or one."""
        if not Consensus.wants(params, suffix, fill):
            return 1
        return len(lengths(params.gen_length, params.hole_candidates, params.min_tokens))

    def split(self, req: Request, candidate) -> list[Request]:
        """`req`'s candidates, one exact hole per length: `candidate(length)` makes each."""
        p = req.params
        out = [candidate(L) for L in lengths(p.gen_length, p.hole_candidates, p.min_tokens)]
        g = Group(req, out, {c.id: [] for c in out}, len(out))
        self.groups[req.id] = g
        for c in out:
            self.of[c.id] = g
        return out

    def forget(self, g: Group) -> None:
        self.groups.pop(g.request.id, None)
        for c in g.candidates:
            self.of.pop(c.id, None)

    def report(self, outs: list[StepOutput], now: float) -> tuple[list[StepOutput], list[Group]]:
        """This step's outputs with the candidates' folded into their requests': the other
        requests' as they are, and the groups whose every candidate has finished (the caller
        finishes their requests with `finish`)."""
        mine, done, forwards, views = [], [], {}, {}
        for o in outs:
            g = self.of.get(o.request.id)
            if g is None:
                mine.append(o)
                continue
            g.streamed[o.request.id] += o.new_ids
            forwards[g.request.id] = max(forwards.get(g.request.id, 0), o.forwards)
            if o.canvas is not None:  # a watched request's longest candidate (the whole hole)
                views[g.request.id] = o
            if o.finished:
                g.live -= 1
                if g.live == 0:
                    done.append(g)
        for rid, f in forwards.items():
            r = self.groups[rid].request
            r.status, r.started = Status.RUNNING, r.started or now
            r.nfe += f
        for rid, o in views.items():
            if self.groups[rid].live:  # a finished group's last output is its answer (finish)
                mine.append(StepOutput(self.groups[rid].request, 0, [], False, o.canvas, o.states, o.proposal,
                                       forwards=forwards.get(rid, 0)))
        return mine, done

    def finish(self, g: Group, now: float) -> tuple[Request, StepOutput]:
        """The kept candidate's text as its request's (its first commit: now, when it is sent), and
        the StepOutput that sends it whole."""
        r, cands = g.request, g.candidates
        answers = []
        for c in cands:
            ids = list(c.canvas or [])
            stop = first_stop_index(ids, self.stop)
            answers.append(ids if stop is None else ids[:stop])
        k = choose(answers)
        kept = cands[k]
        for c in cands:
            r.stats.add(c.stats)
        r.commits = list(kept.commits)
        r.committed, r.first_commit = kept.committed, now
        return kept, StepOutput(r, kept.committed, g.streamed[kept.id], True, list(kept.canvas) if r.watch else None,
                                tokens=len(answers[k]))
