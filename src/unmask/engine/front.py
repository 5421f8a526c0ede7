"""What every engine does with requests, whatever its rows hold: ids, the waiting queue, per-request
generators, finishing and forgetting (Engine for masked models, RenoiseEngine for renoising ones)."""

import itertools
import time

import torch

from unmask.accept import accept
from unmask.engine.request import EngineConfig, Request, Status
from unmask.engine.scheduler import Scheduler
from unmask.errors import UnmaskError
from unmask.params import GenerationParams


class RequestFront:
    def __init__(self, arch, device, config: EngineConfig | None) -> None:
        self.arch, self.device = arch, device
        self.config = config or EngineConfig()
        self.scheduler = Scheduler(self.config)
        self.requests: dict[str, Request] = {}
        self.generators: dict[str, torch.Generator] = {}  # requests with a seed draw from their own
        self._ids = itertools.count()

    def _new_request(self, prompt: list[int], params: GenerationParams, request_id: str | None, watch: bool,
                     parts) -> Request:
        """Accept the parameters for this model, queue the request (a reference mode is refused)."""
        params = accept(params, self.arch, engine=True)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise UnmaskError(f"request id {rid!r} is in use")
        req = Request(rid, list(prompt), params, parts(params) if parts else None, time.perf_counter(), watch=watch)
        self.scheduler.add(req)
        self.requests[rid] = req
        if params.seed is not None:
            self.generators[rid] = torch.Generator(self.device).manual_seed(params.seed)
        return req

    def abort(self, request_id: str) -> bool:
        """Stop a request now; its rows are freed. False if it is unknown or already done."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return False
        if req.status == Status.WAITING:
            self.scheduler.remove(req)
        else:
            self._drop_row(req)
        self._finish(req, Status.ABORTED, "abort", None)
        return True

    def _drop_row(self, req: Request) -> None:
        """Free a running request's row (the engine's own row state)."""
        raise NotImplementedError

    def release(self, request_id: str) -> None:
        """Forget a finished request (its record is kept until released)."""
        req = self.requests.get(request_id)
        if req is not None and req.done:
            del self.requests[request_id]
            self.generators.pop(request_id, None)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def waiting(self):
        return self.scheduler.waiting

    def _finish(self, req: Request, status: Status, reason: str, canvas: list[int] | None) -> None:
        req.status, req.finish_reason, req.finished = status, reason, time.perf_counter()
        req.canvas = canvas
