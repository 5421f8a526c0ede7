"""Request batching: which waiting requests join the running batch, and which running rows fit
this step's token budget."""

import time
from collections import deque

import torch

from unmask.engine.kind import Cost
from unmask.engine.request import EngineConfig, Request
from unmask.errors import UnmaskError


class Scheduler:
    """First come, first served. "continuous": a request joins at the next step while fewer than
    `max_num_seqs` run. "static" (the baseline the load benchmark compares with): a batch is
    admitted only when the running one has drained, once `max_num_seqs` requests wait or the
    oldest has waited `static_wait` seconds."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Request] = deque()

    def add(self, req: Request) -> None:
        if len(self.waiting) >= self.config.max_waiting:
            raise UnmaskError(f"the queue is full ({self.config.max_waiting} requests waiting)")
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        self.waiting.remove(req)

    def admit(self, running: int) -> list[Request]:
        """The waiting requests that join the running batch now, oldest first."""
        c = self.config
        if c.scheduling == "static":
            if running or not self.waiting:
                return []  # the running batch drains first
            if len(self.waiting) < c.max_num_seqs and time.perf_counter() - self.waiting[0].arrival < c.static_wait:
                return []
        out = []
        while self.waiting and running + len(out) < c.max_num_seqs:
            out.append(self.waiting.popleft())
        return out

    def budget(self, cost: Cost) -> torch.Tensor | None:
        """(n,) bool: the rows that run this step, or None when all of them fit (known only when
        the kind gave its cost's total: a steady masked step needs no tensor for it). Positions computed (each row kind's cost: a
        masked row's window or canvas, a renoising row's canvas and what it encodes, a speculative
        row's prefill or block and drafter context) are spent oldest first, a kind's late rows
        after the others (a masked row's full forward, O(canvas), after the cached windows,
        O(block)); the first row always runs. A long refresh therefore never delays short cached
        steps beyond the forward they share; what does not fit waits for the next step."""
        if cost.total is not None and cost.total <= self.config.max_num_batched_tokens:
            return None
        positions = cost.positions
        key = cost.seq - cost.seq.min()  # oldest first (rows are in no particular order)
        if cost.late is not None:  # late rows after every other
            key = key + cost.late.long() * (key.max() + 1)
        order = torch.argsort(key)
        within = torch.cumsum(positions[order], 0) <= self.config.max_num_batched_tokens
        within[0] = True
        run = torch.zeros(positions.numel(), dtype=torch.bool, device=positions.device)
        run[order[within]] = True
        return run
