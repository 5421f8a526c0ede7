"""The engine behind the server: one thread steps the request-level engine while requests are
open; the event loop adds and aborts requests through a thread-safe inbox (it never waits for a
step) and receives each request's committed-prefix updates on its own asyncio queue."""

import asyncio
import threading
import time
from dataclasses import dataclass, field

from unmask.engine import EngineConfig, EngineLike, Request, StepOutput
from unmask.errors import UnmaskError
from unmask.params import GenerationParams

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def prometheus(self, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total}", f"{name}_count {self.n}"]
        return lines


@dataclass
class Metrics:
    finished: int = 0
    aborted: int = 0
    nfe: int = 0  # request-forwards: each request counts every forward it is in
    tokens: int = 0  # tokens committed
    steps: int = 0
    drafts: int = 0  # speculative decoding: request-verifies of a drafted block
    draft_tokens: int = 0  # draft tokens proposed
    accepted_tokens: int = 0  # draft tokens the target accepted
    step_seconds: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))


class AsyncEngine:
    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.metrics = Metrics()
        self._inbox: list[tuple] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closed = False
        self._pending = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="unmask-engine", daemon=True)
        self._thread.start()

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    # --- from the event loop -------------------------------------------------------------------
    def submit(self, request_id: str, prompt: list[int], params: GenerationParams, watch: bool = False,
               **holes) -> asyncio.Queue:
        """Queue a request; its StepOutputs (and a final None) arrive on the returned queue.
        `holes`: infilling's suffix and fill (Engine.add_request)."""
        if self._closed:
            raise UnmaskError("the server is shutting down")
        with self._lock:
            if self._pending + self.engine.num_waiting >= self.config.max_waiting:
                raise QueueFull(f"the queue is full ({self.config.max_waiting} requests waiting); try again later")
            q: asyncio.Queue = asyncio.Queue()
            self._queues[request_id] = (asyncio.get_running_loop(), q)
            self._inbox.append(("add", request_id, prompt, params, watch, holes))
            self._pending += 1
        self._wake.set()
        return q

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))
        self._wake.set()

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + self._pending

    @property
    def prefix_cache(self):
        """The engine's prompt-prefix cache (kv/prefix.py PrefixStore), or None."""
        return self.engine.prefix_cache

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                t0 = time.perf_counter()
                outs = self.engine.step()
                if not outs and self.engine.num_running == 0:  # static scheduling: a batch is filling
                    time.sleep(0.002)
                    continue
                self._record(outs, time.perf_counter() - t0)
                for out in outs:
                    self._deliver(out.request.id, out)
                    if out.finished:
                        self._finish(out.request)
        except BaseException as e:  # a bug: fail every open request rather than hang them
            self.error = e
            for rid in list(self._queues):
                self._deliver(rid, e)
                self._deliver(rid, None)
            self._queues.clear()

    def _drain_inbox(self) -> None:
        with self._lock:
            items, self._inbox = self._inbox, []
        for item in items:
            if item[0] == "add":
                _, rid, prompt, params, watch, holes = item
                with self._lock:
                    self._pending -= 1
                try:
                    self.engine.add_request(prompt, params, rid, watch=watch, **holes)
                except UnmaskError as e:
                    self._deliver(rid, e)
                    self._deliver(rid, None)
                    self._queues.pop(rid, None)
            else:
                rid = item[1]
                req = self.engine.requests.get(rid)
                if req is not None and self.engine.abort(rid):
                    self.metrics.aborted += 1
                    self._finish(req)

    def _record(self, outs: list[StepOutput], seconds: float) -> None:
        m = self.metrics
        m.steps += 1
        m.step_seconds.observe(seconds)
        for out in outs:
            m.nfe += out.forwards
            m.tokens += out.tokens
            c = out.stats.as_dict() if out.stats is not None else {}
            if c.get("draft_forwards"):  # speculative rows
                m.drafts += c["draft_forwards"]
                m.draft_tokens += c["drafted"]
                m.accepted_tokens += c["accepted"]
            req = out.request
            if out.new_ids and req.first_commit is not None and req.committed == len(out.new_ids):
                m.ttft.observe(req.first_commit - req.arrival)
            if out.finished:
                m.finished += 1

    def _deliver(self, rid: str, item) -> None:
        entry = self._queues.get(rid)
        if entry is not None:
            loop, q = entry
            loop.call_soon_threadsafe(q.put_nowait, item)

    def _finish(self, req: Request) -> None:
        self._deliver(req.id, None)
        self._queues.pop(req.id, None)
        self.engine.release(req.id)


class QueueFull(UnmaskError):
    """The waiting queue is at its bound (HTTP 429)."""
