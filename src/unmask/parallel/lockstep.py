"""Tensor parallelism's lockstep (unmask.parallel): rank 0's engine, whose every state-changing
call is replayed on the other ranks before their next step (LockstepEngine), and the other ranks'
side: the loop that receives rank 0's commands and applies them to their own engines (`serve`)."""

import traceback
import weakref

import torch
import torch.distributed as dist

from unmask.errors import UnmaskError
from unmask.layers.parallel import TensorParallel
from unmask.parallel.group import Ranks, TensorParallelError, _collective_failure, _gather_objects


def start_ranks(world: int, device: torch.device, worker_args: tuple) -> Ranks:
    """Start the group (Ranks.start) with the other ranks serving rank 0's commands."""
    return Ranks.start(world, device, worker_args, serve)


class LockstepEngine:
    """Rank 0's engine under tensor parallelism, with the engine's surface (unmask.engine.EngineLike:
    add_request, step, abort, release and what the server reads); every call that changes the
    engine's state is applied here at once and replayed on the other ranks before their next step."""

    def __init__(self, ranks: Ranks, engine, config) -> None:
        self._ranks, self._engine = ranks, engine
        self._id = ranks.new_engine_id()
        ranks.queue(("engine", self._id, config))
        weakref.finalize(self, ranks.queue, ("close", self._id))

    @property
    def config(self):
        return self._engine.config

    @property
    def requests(self) -> dict:
        return self._engine.requests

    @property
    def trace(self):
        return self._engine.trace

    @property
    def prefix_cache(self):
        return self._engine.prefix_cache

    @property
    def num_running(self) -> int:
        return self._engine.num_running

    @property
    def num_waiting(self) -> int:
        return self._engine.num_waiting

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished()

    def add_request(self, prompt, params, request_id=None, watch=False, suffix=None, fill=None, constraint=None,
                    logprobs=None):
        if constraint is not None:  # each rank holds a vocabulary slice; the grammar masks the whole vocabulary
            raise UnmaskError("structured output under tensor parallelism is not supported yet",
                              param="structured_outputs")
        if logprobs is not None:  # each rank holds a vocabulary slice: its log-softmax is not the model's
            raise UnmaskError("logprobs under tensor parallelism are not supported yet", param="logprobs")
        with self._ranks.lock:
            req = self._engine.add_request(prompt, params, request_id, watch, suffix=suffix, fill=fill)
            self._ranks.queue(("add", self._id, list(prompt), params, req.id, watch, req.suffix, req.fill))
            return req

    def abort(self, request_id: str) -> bool:
        with self._ranks.lock:
            done = self._engine.abort(request_id)
            if done:
                self._ranks.queue(("abort", self._id, request_id))
            return done

    def release(self, request_id: str) -> None:
        with self._ranks.lock:
            self._engine.release(request_id)
            self._ranks.queue(("release", self._id, request_id))

    def step(self):
        with self._ranks.lock:
            self._ranks.send(("step", self._id))
            try:
                return self._engine.step()
            except TensorParallelError:
                raise
            except Exception as e:
                if _collective_failure(e):
                    self._ranks.fail(e)
                raise



# --- the other ranks ------------------------------------------------------------------------------
def serve(rank: int, world: int, device: torch.device, worker_args: tuple) -> None:
    """`worker_args`: (build, *args); build(tp, *args) makes this rank's front end (LLM._shard:
    the shard built exactly as rank 0 builds its own)."""
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    tp = TensorParallel(rank, world)
    llm, error = None, None
    try:
        llm = worker_args[0](tp, *worker_args[1:])
    except Exception as e:  # reported to rank 0, which raises it
        error = e if isinstance(e, UnmaskError) else f"{type(e).__name__}: {e}"
    _gather_objects(error)
    if error is not None:
        return
    engines: dict = {}
    while True:
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0)
        except Exception:  # rank 0 is gone
            raise SystemExit(4) from None
        batch, rng = box[0]
        if rng is not None:
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state(rng[1])
        for cmd in batch:
            kind = cmd[0]
            if kind == "stop":
                try:
                    dist.barrier()  # rank 0's close() waits here too
                except Exception:
                    pass
                return
            try:
                _apply(llm, engines, cmd)
            except Exception:
                traceback.print_exc()
                raise SystemExit(5) from None


def _apply(llm, engines: dict, cmd: tuple) -> None:
    kind = cmd[0]
    if kind == "generate":
        llm._generate_ids(*cmd[1:])
    elif kind == "engine":
        engines[cmd[1]] = llm._engine(cmd[2])
    elif kind == "close":
        engines.pop(cmd[1], None)
    elif kind == "add":
        _, eid, prompt, params, rid, watch, suffix, fill = cmd
        engines[eid].add_request(prompt, params, rid, watch, suffix=suffix, fill=fill)
    elif kind == "abort":
        engines[cmd[1]].abort(cmd[2])
    elif kind == "release":
        engines[cmd[1]].release(cmd[2])
    elif kind == "step":
        engines[cmd[1]].step()
    else:
        raise ValueError(f"unknown tensor-parallel command {kind!r}")
