"""Data-parallel evaluation on Ray Data: `unmask eval / gsm8k / humaneval / bench --data-parallel N`.

A run's batches become the rows of a Ray dataset; `map_batches` hands them to an actor pool of N
actors, each holding its own copy of the model (Ray Data's ActorPoolStrategy: one model per actor,
loaded once per job), and the decoded batches come back in order as they finish. Every batch is
decoded exactly as one process decodes it (the same prompts together, the same parameters), so
the per-example results equal a one-process run (greedy and seeded decoding are batch-invariant;
unseeded sampling differs between any two runs). The driver keeps its own copy of the model for
the tokenizer and the parameter checks; it decodes nothing.

`DataParallelLLM` is what the evaluation commands take in place of an LLM: it has LLM's surface
(parameters, tokenizer, path) and replaces `generate_batches`. Timing: each batch's `seconds` is
its own decoding time on its actor, so summed seconds are actor-seconds (the run's wall time is
reported beside them); on a machine whose cores the actors share, tokens per actor-second fall as
N grows, which is why speed figures come from one-process runs.
"""

import pickle
import time

from unmask.errors import UnmaskError


class _Decoder:
    """One Ray Data actor: a model, and the batches it is handed."""

    def __init__(self, model: str, dtype: str | None, device: str, threads: int, draft: str | None = None,
                 quantize: str | None = None, linear_kernel: str | None = None) -> None:
        import torch

        from unmask.llm import LLM

        torch.set_num_threads(threads)
        self.llm = LLM(model, dtype=dtype, device=device, draft=draft, quantize=quantize, linear_kernel=linear_kernel)

    def __call__(self, rows: dict, params, chat, unknown_words) -> dict:
        outs = [pickle.dumps(self.llm.generate(pickle.loads(p), params, chat=chat, unknown_words=unknown_words))
                for p in rows["prompts"]]
        return {"i": rows["i"], "output": outs}


class DataParallelLLM:
    """An LLM whose `generate_batches` runs on N Ray Data actors (see the module notes)."""

    def __init__(self, llm, n: int, address: str | None = None, actor_cpus: float | None = None,
                 actor_gpus: float = 0.0) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UnmaskError(f"data_parallel {n!r} must be a positive integer (the number of actors)",
                              param="data_parallel")
        try:
            import ray
        except ImportError as e:
            raise UnmaskError(f"--data-parallel needs Ray Data: pip install 'unmask[ray]' ({e})") from None
        if not ray.is_initialized():  # without an address a new local instance, as `unmask serve` starts
            from unmask.cluster import init_ray

            init_ray(address)
        self.llm, self.n = llm, n
        cpus = ray.cluster_resources().get("CPU", 1)
        self.actor_cpus = actor_cpus if actor_cpus is not None else max(cpus / n, 0.01)
        self.actor_gpus = actor_gpus
        self.threads = max(1, int(self.actor_cpus))
        self.device = str(next(llm.model.parameters()).device)
        self.wall_seconds = 0.0

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def without_draft(self) -> "DataParallelLLM":
        """The same actors' model without its drafter (the bench's AR twin rows beside its DFlash rows)."""
        out = object.__new__(DataParallelLLM)
        out.__dict__.update(self.__dict__, llm=self.llm.without_draft())
        return out

    def generate_batches(self, prompts: list, params, batch_size: int, chat: bool | None = False,
                         unknown_words: str = "error", progress=None) -> list:
        import ray

        if not prompts:
            return []
        batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        ds = ray.data.from_items([{"i": i, "prompts": pickle.dumps(b)} for i, b in enumerate(batches)],
                                 override_num_blocks=len(batches))
        out = ds.map_batches(
            _Decoder, batch_size=1, compute=ray.data.ActorPoolStrategy(size=min(self.n, len(batches))),
            num_cpus=self.actor_cpus, num_gpus=self.actor_gpus,
            fn_constructor_kwargs={"model": str(self.llm.path), "dtype": _dtype_name(self.llm), "device": self.device,
                                   "threads": self.threads,
                                   "draft": None if self.llm.draft_path is None else str(self.llm.draft_path),
                                   "quantize": self.llm.quantize, "linear_kernel": self.llm.linear_kernel},
            fn_kwargs={"params": params, "chat": chat, "unknown_words": unknown_words})
        done: dict = {}
        t0 = time.perf_counter()
        for row in out.iter_rows():
            batch = pickle.loads(row["output"])
            done[int(row["i"])] = batch
            if progress:
                progress(len(batch.results))
        self.wall_seconds += time.perf_counter() - t0
        return [done[i] for i in range(len(batches))]


def _dtype_name(llm) -> str:
    return str(next(llm.model.parameters()).dtype).replace("torch.", "")
