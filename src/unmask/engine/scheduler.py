"""Request batching: which waiting requests join the running batch, and which running rows fit
this step's token budget."""

import time
from collections import deque

import torch

from unmask.cache.base import Plan
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

    def budget(self, plan: Plan) -> torch.Tensor:
        """(n,) bool: the rows that run this step. Positions computed are spent window rows first
        (a cached step costs its window, O(block)), then full rows (O(canvas)), oldest first; the
        first row always runs. A long refresh therefore never delays short cached steps beyond
        the forward they share; what does not fit waits for the next step."""
        n = plan.full.numel()
        order = torch.argsort(plan.full.long() * (n + 1) + torch.arange(n, device=plan.full.device), stable=True)
        within = torch.cumsum(plan.cost[order], 0) <= self.config.max_num_batched_tokens
        within[0] = True
        run = torch.zeros(n, dtype=torch.bool, device=plan.full.device)
        run[order[within]] = True
        return run
