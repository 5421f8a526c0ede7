"""The request-level engine: `add_request`, `step`, `abort` (the shape of nano-vllm / vLLM), one
class for every kind of row.

The running requests are rows of batched tensors held by the engine's row kind (engine/kind.py):
masked diffusion (engine/masked.py: full-attention, block and causal models), renoising canvases
(engine/renoise.py: DiffusionGemma) or speculative decoding (engine/speculative.py: a DFlash
drafter and its target). A request joins the running batch at the next step (continuous
batching) and leaves it the step it finishes or is aborted.

One step (`step`), by role:
1. scheduler.py: admit waiting requests; the kind adds their rows;
2. the kind's `cost`: positions each row would compute; the scheduler's token budget picks the
   rows that run (oldest first, a kind's `late` rows after the others; the first always runs);
3. the kind's `decode(run)`: its forwards and commits, reported in one `Report`;
4. here: every request's record (forwards, commits, its kind's counters, timings) is brought up
   to date, the finished rows leave, and the StepOutputs are built — the same code for every kind.
The engine owns what every kind shares: the request table, the waiting queue, per-request random
generators (draws.py), the token budget, the trace ring and the outputs. The reference loops
(unmask.reference) are not served here; `LLM.generate` runs them.
"""

import itertools
import time
from collections import deque
from dataclasses import replace
from typing import Protocol

import torch

from unmask.constrain import Constraint, GrammarVocab, RowGrammar
from unmask.engine import masked, renoise, speculative  # noqa: F401  (the shipped row kinds register)
from unmask.engine.accept import accept
from unmask.engine.consensus import Consensus
from unmask.engine.draws import Draws
from unmask.engine.kind import ROW_KINDS, KindContext, Report, RowKind, kind_for
from unmask.engine.request import EngineConfig, Request, Status, StepOutput
from unmask.engine.scheduler import Scheduler
from unmask.errors import UnmaskError
from unmask.holes import Template, params_for
from unmask.inputs import check_constraint, check_fill, check_prompts, check_suffix, layout
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.logprobs import check_logprobs
from unmask.sampler.stops import first_stop_index
from unmask.trace import ForwardRecord

__all__ = ["Engine", "EngineConfig", "EngineLike", "ForwardRecord", "Request", "Status", "StepOutput"]


def takes_for(arch, tokens, drafter=None):
    """The request contract (engine/kind.py Takes) of the row kind a model decodes with."""
    return ROW_KINDS.lookup(kind_for(arch, drafter), UnmaskError).takes(arch, tokens)


class EngineLike(Protocol):
    """What the server and `LLM` drive: the Engine, or LockstepEngine (unmask.parallel) that
    replays its calls on the other tensor-parallel ranks."""

    config: EngineConfig
    requests: dict[str, Request]
    trace: deque

    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False, suffix: list[int] | None = None, fill: list[int] | None = None,
                    constraint=None, logprobs: int | None = None) -> Request: ...

    def step(self) -> list[StepOutput]: ...

    def abort(self, request_id: str) -> bool: ...

    def release(self, request_id: str) -> None: ...

    def has_unfinished(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def prefix_cache(self): ...


class Engine:
    def __init__(self, model: DiffusionLM, tokens: TokenIds, config: EngineConfig | None = None, *,
                 drafter=None, kind: str | None = None, tokenizer=None) -> None:
        """`kind`: the row kind's registered name (engine/kind.py); by default the model's own
        ("speculative" with a `drafter`). `tokenizer` (unmask.tokenizer.Tokenizer): what
        structured output compiles its grammars against (requests with a constraint need it)."""
        self.model, self.tokens, self.arch = model, tokens, model.config
        self.device = next(model.parameters()).device
        self.config = config or EngineConfig()
        self.scheduler = Scheduler(self.config)
        self.requests: dict[str, Request] = {}
        self.draws = Draws(self.device)
        self.trace: deque[ForwardRecord] = deque(maxlen=self.config.trace_limit)
        name = kind if kind is not None else kind_for(self.arch, drafter)
        self.kind: RowKind = ROW_KINDS.lookup(name, UnmaskError)(
            KindContext(model, tokens, self.device, self.draws, drafter, int(self.config.prefix_cache_mb * 2**20)))
        self.takes = self.kind.takes(self.arch, tokens)  # what its requests may carry (engine/kind.py Takes)
        self._stop = set(tokens.stop)
        self.consensus = Consensus(self._stop)  # holes decoded at several lengths (engine/consensus.py)
        self._ids = itertools.count()
        self.tokenizer = tokenizer
        self._vocab = None  # the tokenizer as the grammar engine sees it, built for the first constraint

    # --- requests --------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False, suffix: list[int] | None = None, fill: list[int] | None = None,
                    constraint: Constraint | RowGrammar | None = None, logprobs: int | None = None) -> Request:
        """Queue a tokenised prompt. `params` are accepted for this model here (engine/accept.py; a
        reference mode is refused) and the prompt checked against them. A watched request's
        StepOutputs carry its whole canvas (the playground). `suffix`: fixed text after the
        generated hole of gen_length tokens (infilling; a full-attention model's rows only).
        `fill`: the generated region's starting tokens, the mask id at each hole and fixed text
        between holes (a template with several holes, unmask.holes; inputs.check_fill).
        `constraint`: structured output (unmask.constrain): the answer is a word of its language
        (a Constraint, or the RowGrammar `grammar` made for these parameters, e.g. ahead of time
        by a server so that a refusal is an HTTP 400). `logprobs`: report each new token's
        log-probability and the `logprobs` most likely tokens' (StepOutput.logprobs; None: none;
        sampler/logprobs.py says what each kind scores with)."""
        logprobs = check_logprobs(logprobs)
        if logprobs is not None:
            self.takes.need("logprobs", "logprobs")
        if logprobs is not None and fill is not None:
            raise UnmaskError("logprobs are not reported for a template with holes (its fixed text is not generated)")
        params = accept(params, self.arch, engine=True)
        check_prompts([prompt], params, self.arch, self.tokens)
        check_suffix(list(suffix or []), params, self.arch, self.tokens, len(prompt), self.takes)
        prompt, suffix = layout(list(prompt), list(suffix or []), self.takes, self.tokens)  # prefix-suffix-middle
        parts = self.kind.prepare(params)
        fill = None if fill is None else list(fill)
        check_fill(fill, params, self.arch, self.tokens,
                   fill is not None and self.takes.template is None and parts.policy.revises, self.takes)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise UnmaskError(f"request id {rid!r} is in use")
        if isinstance(constraint, RowGrammar):
            check_constraint(constraint.constraint, params, self.takes, self.tokenizer,
                             bool(suffix) or fill is not None)
            grammar = constraint
        else:
            grammar = None if constraint is None else self.grammar(constraint, params, bool(suffix) or fill is not None)
        req = Request(rid, list(prompt), params, parts, time.perf_counter(), watch=watch,
                      stats=self.kind.Stats(), suffix=list(suffix or []), fill=fill, grammar=grammar,
                      logprobs=logprobs)
        if len(self.scheduler.waiting) + self.consensus.rows(params, suffix, fill) > self.config.max_waiting:
            raise UnmaskError(f"the queue is full ({self.config.max_waiting} requests waiting)")
        if fill is not None and params.hole_length == "consensus":
            raise UnmaskError("hole_length 'consensus' decodes one hole at several lengths; a template's holes take it "
                              "one by one (LLM.infill), not as one region", param="hole_length")
        rows = self._candidates(req) if self.consensus.wants(params, suffix, fill) else [req]
        for r in rows:
            self.scheduler.add(r)
            if params.seed is not None:
                self.draws.seed(r.id, params.seed)
        self.requests[rid] = req
        return req

    def _candidates(self, req: Request) -> list[Request]:
        """A consensus hole's rows (engine/consensus.py): an exact hole per candidate length, its
        blocks and tokens per step those of the request (holes.params_for)."""
        what = "structured output" if req.grammar is not None else "logprobs" if req.logprobs is not None else None
        if what is not None:
            raise UnmaskError(f"hole_length 'consensus' answers with one of several decodes once all are done; "
                              f"{what} is not reported for it", param="hole_length")

        def candidate(n: int) -> Request:  # a watched request is shown as its longest candidate
            one = Template(req.prompt, [self.tokens.mask] * n, req.suffix, ((0, n),))
            p = accept(params_for(replace(req.params, hole_length="exact"), one), self.arch, engine=True)
            return Request(f"{req.id}/len{n}", req.prompt, p, self.kind.prepare(p), req.arrival,
                           stats=self.kind.Stats(), suffix=req.suffix, watch=req.watch and n == req.params.gen_length)

        return self.consensus.split(req, candidate)

    def grammar(self, constraint: Constraint, params: GenerationParams, holes: bool = False) -> RowGrammar:
        """A constrained request's grammar state (its plan made for params.gen_length), or a named
        refusal (inputs.check_constraint, the grammar engine's, or no completion that fits).
        `params`: as accepted for this model (add_request accepts them again)."""
        check_constraint(constraint, params, self.takes, self.tokenizer, holes)
        if self._vocab is None:
            self._vocab = GrammarVocab(self.tokenizer, self.tokens.stop, self.arch.vocab_size)
        return self._vocab.row(constraint, params.gen_length)

    @torch.inference_mode()  # a running row's tensors move (they were made in inference mode)
    def abort(self, request_id: str) -> bool:
        """Stop a request now; its rows are freed. False if it is unknown or already done."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return False
        group = self.consensus.groups.get(request_id)
        rows = [req] if group is None else [c for c in group.candidates if not c.done]
        for r in rows:
            if r in self.scheduler.waiting:
                self.scheduler.remove(r)
        running = [self.kind.rows.reqs.index(r) for r in rows if r.status == Status.RUNNING]
        if running:
            self.kind.remove(running)
        for r in rows:
            self._finish(r, Status.ABORTED, "abort", None)
        if group is not None:
            self._done(group)
            self._finish(req, Status.ABORTED, "abort", None)
        return True

    def release(self, request_id: str) -> None:
        """Forget a finished request (its record is kept until released)."""
        req = self.requests.get(request_id)
        if req is not None and req.done:
            del self.requests[request_id]
            self.draws.forget(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.kind.rows.n)

    @property
    def num_running(self) -> int:
        return self.kind.rows.n

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def generators(self) -> dict:
        return self.draws.generators

    @property
    def prefix_cache(self):
        """The row kind's prefix cache (kv/prefix.py PrefixStore: its stats, pages, bytes), or
        None (off, or a kind whose prompt K/V cannot be shared)."""
        return self.kind.prefix

    @property
    def rows(self):
        """The row kind's rows (engine/rows.py)."""
        return self.kind.rows

    @property
    def observer(self):
        return self.kind.observer

    @observer.setter
    def observer(self, obs) -> None:
        """Commit-time diagnostics (engine/diagnostics.py), for a kind that has them (masked rows)."""
        if obs is not None and not self.kind.diagnoses:
            raise UnmaskError(f"the {self.kind.name} row kind has no commit-time diagnostics")
        self.kind.observer = obs

    # --- one step --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        self._admit()
        if self.kind.rows.n == 0:
            return []
        run = self.scheduler.budget(self.kind.cost())
        report = self.kind.decode(run)
        self.trace.extend(report.records)
        return self._outputs(report)

    @torch.inference_mode()
    def _admit(self) -> None:
        """The waiting requests the scheduler admits become rows of the kind."""
        new = self.scheduler.admit(self.kind.rows.n)
        if new:
            now = time.perf_counter()
            for req in new:
                req.status, req.started = Status.RUNNING, req.started or now
            self.kind.admit(new)

    def _outputs(self, report: Report) -> list[StepOutput]:
        """Each request's record and StepOutput from the step's report; finished rows leave."""
        now = time.perf_counter()
        reqs = self.kind.rows.reqs
        outputs, gone = [], []
        for k, i in enumerate(report.rows):
            req = reqs[i]
            req.nfe += report.forwards[k]
            req.commits += report.commits[k]
            req.stats.add(report.stats[k])
            new_ids = report.new_ids[k]
            if new_ids:
                req.first_commit = req.first_commit or now
            req.committed = max(req.committed, report.committed[k])
            view = report.views.get(i)
            out = StepOutput(req, report.committed[k], new_ids, report.done[k], *(view or (None, None, None)),
                             stats=report.stats[k], forwards=report.forwards[k], tokens=sum(report.commits[k]),
                             logprobs=_top(report.logprobs.get(i), req.logprobs))
            outputs.append(out)
            if report.done[k]:
                gone.append(i)
        for i, view in report.views.items():  # watched rows that did not run or report (a running canvas)
            if i not in report.rows:
                req = reqs[i]
                outputs.append(StepOutput(req, req.committed, [], False, *view, stats=self.kind.Stats()))
        if gone:
            finished = [reqs[i] for i in gone]
            self.kind.remove(gone)
            for i, req in zip(gone, finished):
                answer = report.answers[i]
                stopped = first_stop_index(answer, self._stop) is not None
                self._finish(req, Status.FINISHED, "stop" if stopped else "length", answer)
        if self.consensus.of:  # candidates' outputs become their requests' (engine/consensus.py)
            outputs, done = self.consensus.report(outputs, now)
            for group in done:
                kept, out = self.consensus.finish(group, now)
                self._done(group)
                self._finish(group.request, Status.FINISHED, kept.finish_reason, kept.canvas)
                outputs.append(out)
        return outputs

    def _done(self, group) -> None:
        """A consensus request's candidates are forgotten (their rows have left)."""
        self.consensus.forget(group)
        for c in group.candidates:
            self.draws.forget(c.id)

    def _finish(self, req: Request, status: Status, reason: str, canvas: list[int] | None) -> None:
        req.status, req.finish_reason, req.finished = status, reason, time.perf_counter()
        req.canvas = canvas


def _top(entries: list | None, k: int | None) -> list | None:
    """A request's logprob entries with the most likely tokens it asked for (kinds store more)."""
    if k is None:
        return None
    return [(lp, top[:k]) for lp, top in entries or []]
