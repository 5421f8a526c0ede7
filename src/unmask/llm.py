"""The offline front end: load a checkpoint folder once, generate for batches of prompts.

`generate` has two branches: native decoding is "add every request, step until done" on the
request engine (unmask.engine; the diffusion models, block models and the AR twin), and a
reference mode (`compat`) runs its reference's own loop as one batch (unmask.reference). The AR
twin used to have a dedicated offline loop; the engine is as fast per forward
(benchmarks/ar_offline.py: 0.97x at batch 1, 0.92x at batch 8) with the same tokens, so the loop
was removed (a copy is the tests' reference, tests/reference.py)."""

import itertools
import time
from dataclasses import replace
from pathlib import Path

import torch

from unmask import checkpoint
from unmask.checkpoint import one_process_draft
from unmask.compat import get_mode
from unmask.constrain import Constraint
from unmask.engine import Engine, EngineConfig, EngineLike, takes_for
from unmask.engine.accept import accept, screen
from unmask.engine.consensus import Consensus
from unmask.errors import CheckpointError, UnmaskError
from unmask import holes as holes_
from unmask import infill as infill_
from unmask.inputs import check_prompts, check_suffix, encode, prompt_ids, suffix_ids
from unmask.layers.dispatch import default_numerics
from unmask.loading import EMBEDDED, check_device, default_device, resolve_model_path
from unmask.models.base import TokenIds
from unmask.models.blockdiff import RELEASED_DEFAULTS
from unmask.models.loader import check_linear_kernel, check_split, resolve_dtype
from unmask.outputs import BatchOutput, GenerationResult, result_of
from unmask.parallel import LockstepEngine, check_world, rank_device, run_spmd, start_ranks
from unmask.params import (MODEL_DEFAULT_KEYS, GenerationParams, check_fields, renoise_defaults,
                           resolve_params)
from unmask.reference import run_reference
from unmask.tokenizer import Tokenizer

__all__ = ["LLM", "BatchOutput", "GenerationResult", "EMBEDDED", "default_device", "resolve_model_path"]


class LLM:
    """`LLM(model_dir).generate(prompts, GenerationParams(...))`."""

    def __init__(self, model: str | Path | None = None, dtype: str | None = None, device: str = "cpu",
                 tensor_parallel: int = 1, draft: str | Path | None = None, quantize: str | None = None,
                 linear_kernel: str | None = None) -> None:
        """`model`: a checkpoint folder, "default" / None for the embedded model, "default-ar" for
        its autoregressive twin, "default-block" for its block-diffusion sibling.
        `tensor_parallel` N > 1 splits the model over N processes on torch.distributed (gloo on
        CPU, NCCL on GPUs: unmask.parallel); this process is rank 0. `close()` ends them.
        `draft`: a DFlash drafter folder (z-lab's released layout, or "default-dflash", the embedded
        drafter of "default-ar") for this autoregressive model: requests are decoded by
        speculative decoding (unmask.engine.speculative), with the target's own output.
        `quantize`: "int8" stores the linear layers' weights in int8 (CPU: unmask.layers.quant; GPU:
        torchao, unmask.layers.torchao_quant), "int4" in 4 bits, groups of 32 (CPU only:
        unmask.layers.int4; an untied head and the token embedding in int8), "fp8" in float8 (GPU
        only).
        `linear_kernel`: float32 linear layers on CPU through "auto" (the faster kernel per shape,
        measured once per machine), "default" (PyTorch's) or "onednn" (unmask.layers.dispatch);
        None: env UNMASK_LINEAR_KERNEL, else "auto"."""
        self.path = resolve_model_path(model)
        self.quantize = quantize
        self.linear_kernel = check_linear_kernel(linear_kernel)
        self.drafter, self.draft_path = None, None
        if draft is not None:
            self.draft_path = resolve_model_path(draft)
            one_process_draft(check_world(tensor_parallel))
        if dtype is not None and not isinstance(dtype, str):
            raise UnmaskError(f"dtype {dtype!r} must be a name: auto, float32, bfloat16 or float16")
        device = check_device(device)
        if self.linear_kernel == "onednn" and (device.type != "cpu" or resolve_dtype(dtype, device) != torch.float32):
            raise UnmaskError(f"linear_kernel 'onednn' is a float32 CPU kernel; with device {device} and dtype "
                              f"{dtype or 'auto'} it would not be used", param="linear_kernel")
        self.ranks = None
        if check_world(tensor_parallel) > 1:
            check_split(self.path, tensor_parallel)  # before any process starts
            self.ranks = start_ranks(tensor_parallel, device, (LLM._shard, str(self.path), dtype, device, quantize,
                                                               self.linear_kernel))
            error = None
            try:
                self._load(dtype, rank_device(device, 0), self.ranks.tp)
            except UnmaskError as e:
                error = e
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            self.ranks.loaded(error)  # raises the first rank's error
        else:
            self._load(dtype, device, None)

    @staticmethod
    def check_args(model=None, dtype: str | None = None, device: str = "cpu", tensor_parallel: int = 1,
                   draft=None, quantize: str | None = None, linear_kernel: str | None = None) -> Path:
        """What LLM(...) with these arguments checks before it loads anything, without loading
        (for processes that load elsewhere: Ray Serve replicas, Ray Data actors; unmask.checkpoint).
        Returns the model folder."""
        return checkpoint.check_args(model, dtype, device, tensor_parallel, draft, quantize, linear_kernel)

    @classmethod
    def _shard(cls, tp, path: str, dtype: str | None, device, quantize: str | None = None,
               linear_kernel: str = "auto") -> "LLM":
        """Rank tp.rank's LLM (a worker of unmask.parallel)."""
        llm = cls.__new__(cls)
        llm.path, llm.ranks, llm.drafter, llm.draft_path = Path(path), None, None, None
        llm.quantize, llm.linear_kernel = quantize, linear_kernel
        llm._load(dtype, rank_device(device, tp.rank), tp)
        return llm

    def _load(self, dtype: str | None, device, tp) -> None:
        """The checkpoint opened (unmask.checkpoint), then the decoding settings it recommends
        checked: they must themselves be valid."""
        o = checkpoint.open_checkpoint(self.path, dtype, device, tp, self.quantize, self.linear_kernel,
                                       getattr(self, "draft_path", None))
        self.model, self.config, self.generation_config = o.model, o.config, o.generation_config
        self.tokenizer, self.token_ids, self.drafter = o.tokenizer, o.token_ids, o.drafter
        try:
            check_fields(self.generation_defaults)
        except UnmaskError as e:
            raise CheckpointError(f"{self.path / 'generation_config.json'}: {e}") from None

    @classmethod
    def from_parts(cls, model, tokenizer: Tokenizer, token_ids: TokenIds, drafter=None) -> "LLM":
        """An LLM over an in-memory model (training-time evaluation), with a DFlash drafter if given."""
        llm = cls.__new__(cls)
        llm.path, llm.config, llm.generation_config, llm.ranks = None, {}, {}, None
        llm.drafter, llm.draft_path, llm.quantize, llm.linear_kernel = drafter, None, None, "default"
        llm.model, llm.tokenizer, llm.token_ids = model, tokenizer, token_ids
        return llm

    @property
    def arch(self):
        return self.model.config

    @property
    def generation_defaults(self) -> dict:
        """What the checkpoint's generation_config.json recommends: the canvas shape (gen_length,
        block_length, steps) and the diffusion decoding settings (policy, its knobs, cache);
        sampling settings (temperature, top_p, ...) stay the caller's."""
        g = self.generation_config
        if self.takes.sampler is not None:  # a renoising model: its sampler's fields, as its generate reads them
            return renoise_defaults(g)
        defaults = {k: g[k] for k in MODEL_DEFAULT_KEYS if k in g}
        if self.arch.block_size:  # a block-diffusion model decodes its own blocks, with its exact cache
            for k, v in RELEASED_DEFAULTS.get(self.arch.family, {}).items():
                if k != "block_length" or self.arch.block_size % v == 0:  # a sub-block must divide the block
                    defaults.setdefault(k, v)
            defaults.setdefault("block_length", self.arch.block_size)
            defaults.setdefault("cache", "exact")
        return defaults

    def default_params(self, **given) -> GenerationParams:
        """Checked parameters: `given`, then the checkpoint's recommendations, then unmask's fast
        defaults (not for an autoregressive model). What `generate` uses when given no parameters."""
        return self.params_for(given)

    def params_for(self, given: dict, fast: bool = True) -> GenerationParams:
        """What every front end does with the fields a caller gave (the CLI's flags, a request's
        fields, `default_params`): resolve them with the model's defaults, then accept them for
        this model, checking the cross-field rules once (in `accept`)."""
        return self.accept(self.resolve(given, fast, check=False), [k for k, v in given.items() if v is not None])

    def resolve(self, given: dict, fast: bool = True, check: bool = True) -> GenerationParams:
        """Checked (not yet accepted; `check=False`: fields only) parameters from the fields a
        caller gave, this model's generation defaults and, with `fast` (not for an autoregressive
        or renoising model), unmask's fast defaults. A renoising model's sampler settings come from
        its checkpoint."""
        sampler = self.takes.sampler  # rows that decode as a reference sampler does, its settings theirs
        keys = get_mode(sampler).model_keys if sampler is not None else ()
        return resolve_params(screen(given, self.arch), self.generation_defaults, fast and self.takes.fast,
                              block_size=self.arch.block_size, model_keys=keys, check=check)

    def accept(self, params: GenerationParams, given=None) -> GenerationParams:
        """`params` as this model runs them (unmask.engine.accept), or an UnmaskError naming the problem."""
        return accept(params, self.arch, given)

    def encode(self, prompts: str | list[str], chat: bool | None = None, unknown_words: str = "error") -> list[list[int]]:
        """Text prompts as token ids (unmask.inputs.encode)."""
        return encode(self.tokenizer, prompts, chat, unknown_words, self.arch.max_positions)

    def _params(self, params: GenerationParams | dict | None) -> GenerationParams:
        if params is None:
            return self.default_params()
        if isinstance(params, dict):  # GenerationParams' fields by name, then the model's defaults
            return self.default_params(**params)
        return self.accept(params)

    def infill(self, templates: str | list[str], params: GenerationParams | dict | None = None) -> BatchOutput:
        """Fill the holes of text templates (unmask.holes: `<|hole:N|>` markers, `<|hole|>` one of
        gen_length tokens). Each result's `holes` holds its holes' texts and `text` the region from
        the first hole to the last with them filled. One hole at the end of the text runs on every
        model; text after a hole needs a model whose rows read it (unmask.infill)."""
        return infill_.infill(self, templates, self._params(params) if not isinstance(params, GenerationParams)
                              else params)

    def template_params(self, params: GenerationParams, t: holes_.Template) -> GenerationParams:
        """The parameters template `t` decodes with on this model (unmask.infill.template_params)."""
        return infill_.template_params(self, params, t)

    def generate(self, prompts: str | list[str] | list[list[int]], params: GenerationParams | dict | None = None,
                 chat: bool | None = None, unknown_words: str = "error", suffix=None,
                 constraint: Constraint | None = None, logprobs: int | None = None) -> BatchOutput:
        """Prompts are text (tokenised, through the chat template when the tokenizer has one and
        `chat` is not False) or lists of token ids. Without `params`: `default_params()`; a dict
        names GenerationParams fields. Out-of-vocabulary words: see `encode`. `suffix`: the text
        after the hole (infilling: the prompt is the text before it, gen_length the hole), one
        per prompt (a string or ids; a string for a single text prompt); full-attention masked
        models only (unmask.inputs.check_suffix). `constraint` (unmask.constrain.Constraint: a
        JSON schema, regex, choice or grammar): every answer is a word of its language
        (structured output; docs/structured-output.md). `logprobs`: each result's tokens'
        log-probabilities and the `logprobs` most likely tokens' (GenerationResult.logprobs;
        engine/logprobs.py)."""
        params = self._params(params)
        constraint = _constraint(constraint)
        ids = prompt_ids(self.tokenizer, prompts, chat, unknown_words, self.arch.max_positions)
        check_prompts(ids, params, self.arch, self.token_ids)
        tails = suffix_ids(self.tokenizer, suffix, prompts, len(ids), unknown_words)
        for p, s in zip(ids, tails or []):
            check_suffix(s, params, self.arch, self.token_ids, len(p), self.takes)
        extras = {k: v for k, v in (("constraint", constraint), ("logprobs", logprobs)) if v is not None}
        if extras:  # what only this process's engine reports or enforces
            self._engine_only(params, extras)
            return self._generate_engine(ids, params, tails, **extras)
        if params.compat is not None or (self.ranks is not None and tails is None):
            if self.ranks is not None:  # every rank runs the same generation over its shard
                return run_spmd(self.ranks, ("generate", ids, params, tails),
                                lambda: self._generate_ids(ids, params, tails))
            return self._generate_ids(ids, params, tails)
        return self._generate_engine(ids, params, tails, lockstep=True)

    def _engine_only(self, params: GenerationParams, extras: dict) -> None:
        """Refusals of structured output and logprobs where only one process's engine has them:
        not from a reference loop (its own tokens only), not yet under tensor parallelism."""
        if "logprobs" in extras and params.compat is not None:
            raise UnmaskError(f"logprobs are not reported in compat mode {params.compat!r} (the reference "
                              "loop's own tokens only)", param="logprobs")
        if self.ranks is not None:
            what = ("structured output under tensor parallelism is not supported yet (the grammar masks a whole "
                    "vocabulary; each rank holds a slice)" if "constraint" in extras else
                    "logprobs under tensor parallelism are not supported yet")
            raise UnmaskError(what, param="structured_outputs" if "constraint" in extras else "logprobs")

    def generate_batches(self, prompts: list, params: GenerationParams, batch_size: int, chat: bool | None = False,
                         unknown_words: str = "error", progress=None, suffixes: list | None = None,
                         constraint: Constraint | None = None) -> list[BatchOutput]:
        """`prompts` decoded `batch_size` at a time: one BatchOutput per batch, in order;
        `progress(k)` after each batch of k prompts; `suffixes`: one per prompt (infilling).
        (unmask.bench.data_parallel spreads the batches over Ray Data actors with the same results.)"""
        outs = []
        for i in range(0, len(prompts), batch_size):
            tails = None if suffixes is None else list(suffixes[i : i + batch_size])
            outs.append(self.generate(list(prompts[i : i + batch_size]), params, chat=chat, unknown_words=unknown_words,
                                      suffix=tails, constraint=constraint))
            if progress:
                progress(len(outs[-1].results))
        return outs

    def _generate_ids(self, ids: list[list[int]], params: GenerationParams,
                      suffixes: list[list[int]] | None = None) -> BatchOutput:
        if params.compat is None:
            return self._generate_engine(ids, params, suffixes)
        t0 = time.perf_counter()
        with default_numerics(self.model):  # the reference's tokens whatever kernel the layers were put on
            decoded = run_reference(self.model, self.token_ids, ids, params, suffixes)
        seconds = time.perf_counter() - t0
        ends = list(itertools.accumulate(s.seconds for s in decoded.steps))
        edits = decoded.row_edits or [[] for _ in decoded.rows]
        results = [self.result_of(raw, decoded.row_nfe[r], decoded.row_commits[r],
                                  ends[decoded.row_nfe[r] - 1] if decoded.row_nfe[r] else 0.0, edits=sum(edits[r]))
                   for r, raw in enumerate(decoded.rows)]
        return BatchOutput(results, decoded.steps, seconds, decoded.cache, decoded.prompt_len)

    def engine(self, config: EngineConfig | None = None) -> EngineLike:
        """A request-level engine over this model (continuous batching; see unmask.engine). Under
        tensor parallelism, rank 0's engine, whose calls the other ranks replay in lockstep."""
        if self.ranks is not None:
            return LockstepEngine(self.ranks, self._engine(config), config)
        return self._engine(config)

    def _engine(self, config: EngineConfig | None) -> Engine:
        """The engine's row kind is the model's (engine/kind.py): speculative rows with a drafter
        (it proposes, this model verifies), renoising canvases, or masked diffusion."""
        return Engine(self.model, self.token_ids, config, drafter=self.drafter, tokenizer=self.tokenizer)

    def _generate_engine(self, ids: list[list[int]], params: GenerationParams | list[GenerationParams],
                         suffixes: list[list[int]] | None = None, fills: list | None = None,
                         lockstep: bool = False, constraint: Constraint | None = None,
                         logprobs: int | None = None) -> BatchOutput:
        """Offline generation is "add every request, step until done" on the serving engine.
        `params`: one for every prompt, or one each. `lockstep`: under tensor parallelism, on
        rank 0's engine replayed on the other ranks (else every rank runs this same call)."""
        each = params if isinstance(params, list) else [params] * len(ids)
        params = each[0]
        # every request joins at the first step, so none could reuse another's prompt: no prefix cache;
        # a hole decoded at several lengths takes a row for each (engine/consensus.py)
        rows = sum(Consensus.rows(each[r], None if suffixes is None else suffixes[r],
                                  None if fills is None else fills[r]) for r in range(len(ids)))
        config = EngineConfig(max_num_seqs=rows, max_waiting=rows, trace_limit=None, prefix_cache_mb=0)
        engine = self.engine(config) if lockstep else self._engine(config)
        t0 = time.perf_counter()
        reqs = [engine.add_request(p, each[r], suffix=None if suffixes is None else suffixes[r],
                                   fill=None if fills is None else fills[r], constraint=constraint,
                                   **({} if logprobs is None else {"logprobs": logprobs}))
                for r, p in enumerate(ids)]
        scores: dict[str, list] = {q.id: [] for q in reqs}
        while engine.has_unfinished():
            for out in engine.step():
                if out.logprobs:
                    scores[out.request.id] += out.logprobs
        seconds = time.perf_counter() - t0
        bounded = [None if suffixes is None or not holes_.ends_at_suffix(each[r])
                   or (fills is not None and fills[r] is not None) else suffixes[r] for r in range(len(reqs))]
        results = [self.result_of(q.canvas, q.nfe, q.commits, q.finished - t0, suffix=bounded[r], **q.counters())
                   for r, q in enumerate(reqs)]
        if logprobs is not None:
            results = [replace(r, logprobs=scores[q.id][: len(r.token_ids)]) for r, q in zip(results, reqs)]
        return BatchOutput(results, list(engine.trace), seconds, params.cache, max(len(p) for p in ids))

    def without_draft(self) -> "LLM":
        """This model without its drafter (shares the weights): plain autoregressive decoding."""
        out = object.__new__(LLM)
        out.__dict__.update(self.__dict__, drafter=None, draft_path=None)
        return out

    @property
    def takes(self):
        """What this model's requests may carry (engine/kind.py Takes: its row kind's contract)."""
        return takes_for(self.arch, self.token_ids, self.drafter)

    @property
    def tensor_parallel(self) -> int:
        return 1 if self.ranks is None else self.ranks.world

    def close(self) -> None:
        """End the tensor-parallel ranks (nothing to do for a one-process model)."""
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def result_of(self, raw: list[int], nfe: int, commits: list[int], seconds: float, suffix: list[int] | None = None,
                  **counters) -> GenerationResult:
        """A GenerationResult from a generated region: cut at the first stop id (and, with the
        `suffix` of a hole whose length is bounded, where it goes on with that text), detokenised;
        `counters`: a row kind's (unmask.engine.kind.Stats) or a reference loop's by name."""
        return result_of(self.tokenizer, self.token_ids.stop, raw, nfe, commits, seconds, suffix, **counters)


def _constraint(constraint) -> Constraint | None:
    """A structured-output constraint: a Constraint, or a JSON schema given as a dict (or True);
    anything else is refused by name with what to pass."""
    if constraint is None or isinstance(constraint, Constraint):
        return constraint
    if isinstance(constraint, dict) or constraint is True:
        return Constraint.json_schema(constraint)
    raise UnmaskError(f"constraint {constraint!r:.60} must be a unmask.constrain.Constraint (Constraint.json_schema("
                      "schema), .regex(r), .choice([...]), .grammar(lark or gbnf)) or a JSON schema dict",
                      param="constraint")
