"""Tensor parallelism's processes: N ranks on torch.distributed, stepping in lockstep.

Rank 0 is the caller's process: it owns the requests (the front end, the scheduler's queue, the
server) and, before each unit of work, broadcasts what the other ranks must do: the requests
added, aborted and released since the last step, then "step" (or a whole offline `generate`),
with rank 0's random-number state, so that every rank makes the same decisions with the same
draws. Every rank then runs the same engine step over its shard of the model: the forwards'
collectives (all-reduce after row-parallel layers and experts, vocabulary statistics in the
sampler) keep the shards in agreement, and only rank 0's outputs are used. Nothing here routes
requests or calls procedures over the network: the only channel is torch.distributed's
broadcast, and the engine itself is the single-process engine.

Two ways to start the ranks:
- by unmask (`LLM(..., tensor_parallel=N)`, `unmask generate/serve --tensor-parallel N`): rank 0
  spawns N - 1 worker processes on this machine, which join over a loopback TCP store, as vLLM's
  multiprocessing executor does;
- by torchrun (`torchrun --nproc-per-node N -m unmask generate ... --tensor-parallel N`): every
  process builds the LLM; ranks other than 0 serve rank 0 and exit when it closes.

A rank that dies ends the job: the surviving ranks' collectives fail (gloo and NCCL notice the
closed connection, a timeout is the backstop) and rank 0 raises a TensorParallelError naming the
rank, instead of waiting forever. The group cannot continue with a rank missing.
"""

from unmask.parallel.group import (Ranks, TensorParallelError, check_world, launched_by_torchrun, rank_device,
                                   run_spmd, tp_timeout)
from unmask.parallel.lockstep import LockstepEngine, start_ranks

__all__ = ["LockstepEngine", "Ranks", "TensorParallelError", "check_world", "launched_by_torchrun", "rank_device",
           "run_spmd", "start_ranks", "tp_timeout"]
