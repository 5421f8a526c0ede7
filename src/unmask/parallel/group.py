"""Tensor parallelism's process group (unmask.parallel): its ranks started (spawned on this
machine, or joined under torchrun), the command broadcast from rank 0, a dead rank found and
named, the shutdown. What the commands are and how the other ranks replay them is lockstep.py."""

import atexit
import math
import os
import socket
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from unmask.errors import UnmaskError
from unmask.layers.parallel import TensorParallel

DEFAULT_TIMEOUT_S = 300.0  # a collective that waits longer fails (a dead rank is usually seen at once)


def tp_timeout() -> timedelta:
    """The collectives' timeout: UNMASK_TP_TIMEOUT seconds (a number > 0), else 300; read when a group
    starts, so a bad value is an UnmaskError naming it, not a crash at import."""
    text = os.environ.get("UNMASK_TP_TIMEOUT")
    if text is None or not text.strip():
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UnmaskError(f"UNMASK_TP_TIMEOUT {text!r} must be a number of seconds > 0 (default "
                          f"{DEFAULT_TIMEOUT_S:g})", param="tensor_parallel")
    return timedelta(seconds=seconds)


_ACTIVE: list = []  # the Ranks of this process (one group at a time: torch.distributed's default group)


class TensorParallelError(UnmaskError):
    """A rank of a tensor-parallel group failed; the group cannot continue."""


def check_world(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnmaskError(f"tensor_parallel {value!r} must be a positive integer (the number of ranks)",
                          param="tensor_parallel")
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r runs on cuda:r (a GPU per rank); CPU ranks share the CPU."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


class Ranks:
    """Rank 0's handle on the group: the worker processes it started (none under torchrun), the
    command broadcast, the failure checks and the shutdown."""

    def __init__(self, world: int, tp: TensorParallel, procs: list) -> None:
        self.world, self.tp, self.procs = world, tp, procs
        self.pending: list[tuple] = []
        self.lock = threading.RLock()  # one unit of work at a time: the collectives run in one order
        self.failed: str | None = None
        self.closed = False
        self.serving = False  # every rank loaded its shard and waits for commands
        self._engines = 0

    @classmethod
    def start(cls, world: int, device: torch.device, worker_args: tuple, serve) -> "Ranks":
        """Start (or, under torchrun, join) the group; rank 0 returns, the others never do: they run
        `serve(rank, world, device, worker_args)` (unmask.parallel.lockstep.serve) until rank 0 closes."""
        if _ACTIVE and not _ACTIVE[-1].closed:
            raise UnmaskError("a tensor-parallel model is already running in this process; close it first "
                              "(LLM.close())", param="tensor_parallel")
        if dist.is_available() and dist.is_initialized():
            raise UnmaskError("torch.distributed is already initialised in this process; unmask starts its own "
                              "group (or run under torchrun)", param="tensor_parallel")
        timeout = tp_timeout()  # a bad UNMASK_TP_TIMEOUT is named before any process starts
        procs = []
        if launched_by_torchrun():
            if int(os.environ["WORLD_SIZE"]) != world:
                raise UnmaskError(f"tensor_parallel {world} differs from torchrun's WORLD_SIZE "
                                  f"{os.environ['WORLD_SIZE']}", param="tensor_parallel")
            rank = int(os.environ["RANK"])
            dist.init_process_group(_backend(device), timeout=timeout)
            if rank:
                serve(rank, world, device, worker_args)
                dist.destroy_process_group()
                raise SystemExit(0)
        else:
            port = _free_port()
            ctx = torch.multiprocessing.get_context("spawn")
            threads = torch.get_num_threads()
            for rank in range(1, world):
                p = ctx.Process(target=_worker_main, args=(rank, world, port, device, threads, worker_args, serve),
                                daemon=True, name=f"unmask-tp-rank{rank}")
                p.start()
                procs.append(p)
            try:
                dist.init_process_group(_backend(device), init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                        world_size=world, timeout=timeout)
            except Exception as e:
                for p in procs:
                    p.kill()
                raise TensorParallelError(f"the tensor-parallel group of {world} ranks did not form: {e}") from None
        ranks = cls(world, TensorParallel(0, world), procs)
        _ACTIVE.append(ranks)
        atexit.register(ranks.close)
        return ranks

    def loaded(self, error: str | None) -> None:
        """After every rank loaded its shard: the first rank's error, raised here on rank 0."""
        errors = self._collective(lambda: _gather_objects(error))
        bad = [(r, e) for r, e in enumerate(errors) if e]
        self.serving = not bad  # every rank now waits for commands (and answers "stop" with a barrier)
        if bad:
            self.close()
            r, e = bad[0]
            raise (e if isinstance(e, UnmaskError) else TensorParallelError(f"rank {r} could not load its shard: {e}"))

    def send(self, *commands: tuple) -> None:
        """Broadcast the queued commands and these (rank 0's RNG state with them)."""
        batch, self.pending = self.pending + list(commands), []
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None)
        self._collective(lambda: dist.broadcast_object_list([(batch, rng)], src=0))

    def queue(self, command: tuple) -> None:
        self.pending.append(command)

    def new_engine_id(self) -> int:
        self._engines += 1
        return self._engines

    def _collective(self, fn):
        if self.failed:
            raise TensorParallelError(self.failed)
        if self.closed:
            raise TensorParallelError("the tensor-parallel model was closed")
        try:
            return fn()
        except Exception as e:
            self.fail(e)

    def fail(self, error: BaseException):
        """A collective failed: find the rank that died, end the group, raise."""
        if isinstance(error, TensorParallelError):
            raise error
        dead = []
        for rank, p in enumerate(self.procs, start=1):
            p.join(timeout=2.0)
            if not p.is_alive():
                dead.append(f"rank {rank} exited with code {p.exitcode}")
        what = "; ".join(dead) or f"a collective failed ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        self.failed = f"tensor-parallel group of {self.world} ranks failed: {what}; the model cannot continue"
        self.close()
        raise TensorParallelError(self.failed) from None

    def close(self) -> None:
        """Tell the workers to stop, wait for them, leave the group."""
        if self.closed:
            return
        self.closed = True
        if not self.failed:
            try:
                dist.broadcast_object_list([([("stop",)], None)], src=0)
                if self.serving:
                    # every rank has the stop before any leaves the group: a rank tearing down its
                    # sockets while another still uses them aborted the process (SIGABRT, seen under
                    # torchrun, where rank 0 cannot wait for the others to exit)
                    dist.barrier()
            except Exception:  # a dead rank: nothing to tell it
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def _gather_objects(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _collective_failure(e: BaseException) -> bool:
    """An exception from a collective (a peer gone), not from the engine's own logic."""
    name = type(e).__name__
    return name in ("DistBackendError", "DistNetworkError", "DistError") or "gloo" in str(e).lower() or \
        "connection" in str(e).lower()


def run_spmd(ranks: Ranks, command: tuple, local):
    """Broadcast `command`, then run `local()` here (the other ranks run the same)."""
    with ranks.lock:
        ranks.send(command)
        try:
            return local()
        except TensorParallelError:
            raise
        except Exception as e:
            if _collective_failure(e):
                ranks.fail(e)
            raise



# --- a spawned rank --------------------------------------------------------------------------------
def _worker_main(rank: int, world: int, port: int, device: torch.device, threads: int, worker_args: tuple,
                 serve) -> None:
    """A spawned rank: join the group, load the shard, serve rank 0's commands until "stop"."""
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(_backend(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=tp_timeout())
    except Exception:
        raise SystemExit(3) from None
    serve(rank, world, device, worker_args)
    dist.destroy_process_group()
