"""The request-level engine: `add_request`, `step`, `abort` (the shape of nano-vllm / vLLM).

Every request has its own canvas, block position, step counter, schedule, KV rows, parameters
and random generator; the running requests are rows of batched tensors (engine.rows), so a step
is tensor code over all rows, whatever block each row is in. A request joins the running batch
at the next step (continuous batching) and leaves it the step it finishes or is aborted.

One step (`step`), by role:
1. scheduler.py: admit waiting requests; after planning, the token budget decides which rows run.
2. each setting's cache policy (unmask.cache) plans its rows: a full forward, or a window
   against the row's K/V; the engine merges the plans and never looks inside a policy.
3. runner.py: one forward for the window rows and one for the full rows (each row at its own
   columns), plus the recomputation of rows whose cache doubted their cached step (work.py).
4. commit.py: proposals, the commit policy's choice and the schedule's quota, per setting.
5. postprocess.py: blocks advance, stops are found, finished rows leave, outputs are made.

Greedy output of a request does not depend on what else runs: padding is masked, positions are
each row's own, and each request samples from its own generator. Block-diffusion models (cache
exact) and the autoregressive twin (cache causal: blocks of one token) run here with their own
cache policies. The reference loops (unmask.reference) are not served here.
"""

import itertools
import time
from collections import deque

import torch

from unmask.cache.base import Plan
from unmask.engine import postprocess
from unmask.engine.commit import Committer
from unmask.engine.front import RequestFront
from unmask.engine.parts import DecodeParts, build_parts
from unmask.engine.request import EngineConfig, Request, Status, StepOutput
from unmask.engine.rows import RowState
from unmask.engine.runner import ModelRunner
from unmask.engine.work import StepWork
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams, setting_key
from unmask.sampler.stops import first_stop_index
from unmask.trace import ForwardRecord

__all__ = ["Engine", "EngineConfig", "ForwardRecord", "Request", "Status", "StepOutput"]


class Engine(RequestFront):
    def __init__(self, model: DiffusionLM, tokens: TokenIds, config: EngineConfig | None = None) -> None:
        super().__init__(model.config, next(model.parameters()).device, config)
        self.model, self.tokens = model, tokens
        # hidden j scores token j + shift: Dream and the AR twin shift by one
        self.shift = 1 if self.arch.causal else self.arch.logit_shift
        self.align = self.arch.block_size  # a block-diffusion model: its attention blocks are the decoding blocks
        self.mask = tokens.mask
        self.stop_ids = torch.tensor(tokens.stop, device=self.device)
        self.rows = RowState(self.device, tokens.pad if tokens.pad is not None else tokens.eos)
        self.settings: dict[tuple, int] = {}  # decoding setting -> id, while a running row uses it
        self.parts: dict[int, DecodeParts] = {}
        self.trace: deque[ForwardRecord] = deque(maxlen=self.config.trace_limit)
        self.runner = ModelRunner(model, self.rows, self.shift)
        # a tensor-parallel model hands its vocabulary slice to the sampler (no gathered logits)
        self.committer = Committer(self.rows, self.parts, self.mask, self.generators,
                                   getattr(model, "tp", None), self.arch.vocab_size)
        self._setting_ids = itertools.count()
        self._watching = 0  # watched requests in the engine (their rows cost one transfer per step)
        self.observer = None  # diagnostics (unmask.engine.diagnostics): sees every forward, changes none

    # --- requests --------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: GenerationParams, request_id: str | None = None,
                    watch: bool = False) -> Request:
        """Queue a tokenised prompt. `params` are accepted for this model here (unmask.accept; a
        reference mode is refused). A watched request's StepOutputs carry its whole canvas and
        `Request.proposal` this step's proposals."""
        req = self._new_request(prompt, params, request_id, watch, lambda p: build_parts(p, self.tokens))
        self._watching += watch
        return req

    def _drop_row(self, req: Request) -> None:
        i = self.rows.reqs.index(req)
        self.rows.keep(torch.tensor([j for j in range(self.rows.n) if j != i], dtype=torch.long, device=self.device))
        self._forget_settings()

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.rows.n)

    @property
    def num_running(self) -> int:
        return self.rows.n

    # --- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        self._admit()
        if self.rows.n == 0:
            return []
        groups = self._by_setting()  # (cache policy, its rows) for each running setting, once a step
        plan = self._plan(groups)
        verifying = any(cache.verifies for cache, _ in groups)
        work = StepWork(self.rows, plan, self.scheduler.budget(plan), verifying, lambda: self._recompute(groups))
        for f in work:  # window rows, full rows, then the recomputation of doubted rows
            self._run(work, f)
        for cache, rows in groups:  # each policy updates its own per-row counters
            cache.after(self.rows, rows & work.run, work.plan, work.redo, work.committed, self.align)
        outputs = postprocess.advance(self.rows, work.run, self.rows.s, self.rows.e, work.committed, work.seal,
                                      work.redo, self.mask, self.stop_ids, self._finished,
                                      work.had_mask, work.edits, work.remasked)
        self.trace.extend(work.finish_records())
        self._forget_settings()
        return outputs

    def _run(self, work: StepWork, f) -> None:
        r, t0 = self.rows, time.perf_counter()
        fresh = self.runner.fresh(f.idx, r.s, work.W) if self.observer is not None else None  # before commits
        logits = self.runner.forward(f.full, f.idx, work.plan, r.s, work.W, f.all_rows)
        done = self.committer.commit(f.idx, logits, r.s, work.W, f.verify, self._watching > 0)
        if self.observer is not None:
            if self.committer.tp is not None:  # diagnostics compare whole distributions
                logits = self.committer.tp.gather_vocab(logits, self.arch.vocab_size)
            self.observer.observe(self, f.kind, f.idx, r.s, work.W, logits, fresh, done)
        work.record(f, done, time.perf_counter() - t0)

    def _admit(self) -> None:
        for req in self.scheduler.admit(self.rows.n):
            key = setting_key(req.params)
            if key not in self.settings:
                self.settings[key] = sid = next(self._setting_ids)
                self.parts[sid] = req.parts
            p = req.params
            width = p.block_length if self.align else max(p.steps_per_block, 1)  # the quota table
            self.rows.add(req, self.mask, self.settings[key], width, self.align)
            req.status = Status.RUNNING

    def _by_setting(self) -> list:
        """(setting's cache policy, its rows as an (n,) bool) for each setting that runs."""
        r = self.rows
        return [(self.parts[cfg].cache, r.cfg == cfg) for cfg in sorted(set(r.settings))]

    def _plan(self, groups) -> Plan:
        """Each setting's plan for its rows, merged."""
        return self._merge([(rows, cache.plan(self.rows, self.shift, self.align)) for cache, rows in groups])

    def _recompute(self, groups) -> Plan:
        """What the doubted rows recompute: their verifying caches' plans, merged."""
        return self._merge([(rows, cache.recompute(self.rows, self.shift)) for cache, rows in groups if cache.verifies])

    @staticmethod
    def _merge(plans: list) -> Plan:
        plan = plans[0][1]
        for rows, other in plans[1:]:
            plan = plan.where(rows, other)
        return plan

    def _forget_settings(self) -> None:
        """Settings no running row uses are dropped, so a long-running server's tables stay small."""
        live = set(self.rows.settings)
        for key, sid in list(self.settings.items()):
            if sid not in live:
                del self.settings[key], self.parts[sid]

    def _finished(self, req: Request, canvas: list[int]) -> None:
        stopped = first_stop_index(canvas, set(self.tokens.stop)) is not None
        self._finish(req, Status.FINISHED, "stop" if stopped else "length", canvas)

    def _finish(self, req: Request, status: Status, reason: str, canvas: list[int] | None) -> None:
        super()._finish(req, status, reason, canvas)
        self._watching -= req.watch
