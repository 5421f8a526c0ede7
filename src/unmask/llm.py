"""Offline front end: load a checkpoint folder once, generate for batches of prompts."""

import itertools
import numbers
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from unmask.compat import get_mode
from unmask.engine.ar import decode_ar
from unmask.engine.blockloop import BlockDecoded, decode_fast_dllm_v2
from unmask.engine.engine import Engine, EngineConfig, ForwardRecord
from unmask.engine.loop import StepRecord, decode
from unmask.errors import CheckpointError, UnmaskError
from unmask.models.base import TokenIds
from unmask.models.blockdiff import RELEASED_DEFAULTS
from unmask.models.loader import load_model, read_json
from unmask.params import MODEL_DEFAULT_KEYS, GenerationParams, check_fields, resolve_params
from unmask.tokenizer import Tokenizer, resolve_token_ids


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids up to (not including) the first end-of-text token
    raw_ids: list[int]  # the whole generated region of the canvas (MASK where never committed)
    finish_reason: str  # "stop" (end-of-text committed) or "length"
    nfe: int  # forwards this row took part in
    commits: list[int]  # tokens committed at each of those forwards
    seconds: float = 0.0  # from the start of decoding until this request finished (its latency)
    commit_forwards: int = 0  # block models: forwards that also wrote a finished block's exact K/V

    @property
    def num_tokens(self) -> int:
        """Generated tokens up to and including end of text: the count behind every tokens/s and
        tokens-per-forward figure (the end-of-text padding after it is never counted)."""
        return len(self.token_ids) + (self.finish_reason == "stop")

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / self.nfe if self.nfe else 0.0


@dataclass
class BatchOutput:
    results: list[GenerationResult]
    steps: list[StepRecord | ForwardRecord]  # every batched forward
    seconds: float  # wall time of decode (every forward and the loop), tokenisation excluded
    cache: str
    prompt_len: int  # columns before the generation region (the longest prompt)

    @property
    def nfe(self) -> int:
        return len(self.steps)

    @property
    def tokens(self) -> int:
        """Generated tokens of all rows, each up to and including its end of text."""
        return sum(r.num_tokens for r in self.results)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0


class LLM:
    """`LLM(model_dir).generate(prompts, GenerationParams(...))`."""

    def __init__(self, model: str | Path | None = None, dtype: str | None = None, device: str = "cpu") -> None:
        """`model`: a checkpoint folder, "default" / None for the embedded model, "default-ar" for
        its autoregressive twin."""
        self.path = resolve_model_path(model)
        if dtype is not None and not isinstance(dtype, str):
            raise UnmaskError(f"dtype {dtype!r} must be a name: auto, float32, bfloat16 or float16")
        self.model, self.config = load_model(self.path, dtype=dtype, device=check_device(device))
        gen_path = self.path / "generation_config.json"
        self.generation_config = read_json(gen_path) if gen_path.exists() else {}
        if not isinstance(self.generation_config, dict):
            raise CheckpointError(f"{gen_path} must hold a JSON object")
        self.tokenizer = Tokenizer.from_dir(self.path)
        self.token_ids: TokenIds = resolve_token_ids(self.config, self.generation_config, self.tokenizer)
        check_token_ids(self.token_ids, self.arch.vocab_size, self.path)
        self._check_generation_config(gen_path)

    @classmethod
    def from_parts(cls, model, tokenizer: Tokenizer, token_ids: TokenIds) -> "LLM":
        """An LLM over an in-memory model (training-time evaluation)."""
        llm = cls.__new__(cls)
        llm.path, llm.config, llm.generation_config = None, {}, {}
        llm.model, llm.tokenizer, llm.token_ids = model, tokenizer, token_ids
        return llm

    def _check_generation_config(self, path: Path) -> None:
        """The decoding settings a checkpoint recommends must themselves be valid."""
        try:
            check_fields(self.generation_defaults)
        except UnmaskError as e:
            raise CheckpointError(f"{path}: {e}") from None

    @property
    def generation_defaults(self) -> dict:
        """What the checkpoint's generation_config.json recommends: the canvas shape (gen_length,
        block_length, steps) and the diffusion decoding settings (policy, its knobs, cache);
        sampling settings (temperature, top_p, ...) stay the caller's."""
        g = self.generation_config
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
        defaults (threshold 0.9 with DualCache; not for an autoregressive model). What `generate`
        uses when given no parameters."""
        return resolve_params(given, self.generation_defaults, fast=not self.arch.causal,
                              block_size=self.arch.block_size)

    @property
    def arch(self):
        return self.model.config

    def encode(self, prompts: str | list[str], chat: bool | None = None, unknown_words: str = "error") -> list[list[int]]:
        """Text prompts as token ids. Words the tokenizer cannot represent (it would read them as
        its unknown token) are named in an error, or with unknown_words="ignore" let through (the
        evaluation harnesses count them and warn once per run)."""
        if unknown_words not in ("error", "ignore"):
            raise UnmaskError(f"unknown_words {unknown_words!r} must be 'error' or 'ignore'")
        if isinstance(prompts, str):
            prompts = [prompts]
        if chat is not None and not isinstance(chat, bool):
            raise UnmaskError(f"chat {chat!r} must be True, False or None")
        use_chat = self.tokenizer.chat_template is not None if chat is None else chat
        out = []
        for r, p in enumerate(prompts):
            if not isinstance(p, str):
                raise UnmaskError(f"prompt {r} is a {type(p).__name__}; prompts are all strings or all lists of token ids")
            if not p.strip():
                raise UnmaskError(f"prompt {r} is empty")
            unknown = self.tokenizer.unknown_words(p) if unknown_words == "error" else []
            if unknown:
                raise UnmaskError(f"prompt {r}: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}"
                                  + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""))
            out.append(self.tokenizer.encode_prompt(p, use_chat))
        return out

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: GenerationParams | dict | None = None,
        chat: bool | None = None,
        unknown_words: str = "error",
    ) -> BatchOutput:
        """Prompts are text (tokenised, through the chat template when the tokenizer has one and
        `chat` is not False) or lists of token ids. Without `params`: `default_params()`; a dict
        names GenerationParams fields. Out-of-vocabulary words: see `encode`."""
        params = self._params(params)
        ids = self._prompt_ids(prompts, chat, unknown_words)
        self._check_prompts(ids, params)
        if params.compat is None and not self.arch.causal:
            return self._generate_engine(ids, params)
        t0 = time.perf_counter()
        # an autoregressive twin: its own lockstep KV-cached loop, faster offline than the engine
        # (which serves it online with the same tokens; tests/test_request_engine.py checks that)
        if self.arch.causal:
            decoded = decode_ar(self.model, self.token_ids, ids, params.gen_length, params.temperature, params.seed)
        elif get_mode(params.compat).block_loop:  # Fast-dLLM v2's own loop
            decoded = decode_fast_dllm_v2(self.model, self.token_ids, ids, params)
        else:  # a compat mode: the reference's lockstep loop, as its own batch
            decoded = decode(self.model, self.token_ids, ids, params)
        seconds = time.perf_counter() - t0
        ends = list(itertools.accumulate(s.seconds for s in decoded.steps))
        raws = decoded.rows if isinstance(decoded, BlockDecoded) else decoded.generated.tolist()
        results = [self.result_of(raw, decoded.row_nfe[r], decoded.row_commits[r], ends[decoded.row_nfe[r] - 1]
                                  if decoded.row_nfe[r] else 0.0) for r, raw in enumerate(raws)]
        return BatchOutput(results, decoded.steps, seconds, decoded.cache, decoded.prompt_len)

    def engine(self, config: EngineConfig | None = None) -> Engine:
        """A request-level engine over this model (continuous batching; see unmask.engine.engine)."""
        return Engine(self.model, self.token_ids, config)

    def _generate_engine(self, ids: list[list[int]], params: GenerationParams) -> BatchOutput:
        """Offline generation is "add every request, step until done" on the serving engine."""
        engine = self.engine(EngineConfig(max_num_seqs=len(ids), max_waiting=len(ids)))
        t0 = time.perf_counter()
        reqs = [engine.add_request(p, params) for p in ids]
        while engine.has_unfinished():
            engine.step()
        seconds = time.perf_counter() - t0
        results = [self.result_of(q.canvas, q.nfe, q.commits, q.finished - t0, q.commit_forwards) for q in reqs]
        return BatchOutput(results, engine.trace, seconds, params.cache, max(len(p) for p in ids))

    def _params(self, params) -> GenerationParams:
        if params is None:
            return self.default_params()
        if isinstance(params, dict):  # GenerationParams' fields by name, then the model's defaults
            return self.default_params(**params)
        if not isinstance(params, GenerationParams):
            raise UnmaskError(f"params must be a GenerationParams or a dict of its fields, not {type(params).__name__}")
        if not self.arch.causal:
            return params.check(self.arch.block_size)
        if self.arch.causal:  # block_length and steps do not apply, so neither do the rules between them
            ignored = [f for f in AR_IGNORED if getattr(params, f) != getattr(_REFERENCE, f)]
            if ignored:
                verb = "does" if len(ignored) == 1 else "do"
                raise UnmaskError(f"{', '.join(ignored)} {verb} not apply to an autoregressive model (it decodes one "
                                  "token per forward with its KV cache; gen_length, temperature and seed apply)")
        return params

    def _prompt_ids(self, prompts, chat, unknown_words: str) -> list[list[int]]:
        if isinstance(prompts, str):
            return self.encode(prompts, chat, unknown_words)
        if isinstance(prompts, torch.Tensor):
            if prompts.dtype.is_floating_point or prompts.dtype == torch.bool or prompts.dim() not in (1, 2):
                raise UnmaskError(f"a tensor of prompts must hold integer ids in 1 or 2 dimensions, not {prompts.dtype} "
                                  f"of shape {tuple(prompts.shape)}")
            prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
        if not isinstance(prompts, (list, tuple)):
            raise UnmaskError(f"prompts must be a string, a list of strings or a list of token-id lists, "
                              f"not {type(prompts).__name__}")
        if not prompts:
            raise UnmaskError("no prompts given")
        kinds = [isinstance(p, str) for p in prompts]
        if all(kinds):
            return self.encode(list(prompts), chat, unknown_words)
        if any(kinds):
            r = kinds.index(False)
            raise UnmaskError(f"prompts mix text and token ids (prompt {r} is a {type(prompts[r]).__name__}); "
                              "give all strings or all lists of token ids")
        ids = []
        for r, p in enumerate(prompts):
            if not isinstance(p, (list, tuple)):
                raise UnmaskError(f"prompt {r} is a {type(p).__name__}; prompts are all strings or all lists of token ids")
            bad = next((t for t in p if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
            if bad is not None:
                raise UnmaskError(f"prompt {r}: token id {bad!r} is not an integer")
            ids.append([int(t) for t in p])
        return ids

    def _check_prompts(self, ids: list[list[int]], params: GenerationParams) -> None:
        if not ids:
            raise UnmaskError("no prompts given")
        vocab = self.arch.vocab_size
        for r, p in enumerate(ids):
            if not p:
                raise UnmaskError(f"prompt {r} is empty")
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise UnmaskError(f"prompt {r}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
            if self.token_ids.mask in p:
                raise UnmaskError(f"prompt {r} contains the mask token id {self.token_ids.mask}")
            if len(p) + params.gen_length > self.arch.max_positions:
                raise UnmaskError(
                    f"prompt {r}: {len(p)} prompt tokens + gen_length {params.gen_length} exceeds the model's "
                    f"maximum of {self.arch.max_positions} positions"
                )
        if params.compat is not None:
            get_mode(params.compat).check_prompts(ids, self.arch.family)

    def result_of(self, raw: list[int], nfe: int, commits: list[int], seconds: float,
                  commit_forwards: int = 0) -> GenerationResult:
        """A GenerationResult from a generated region: cut at the first stop id, detokenised."""
        stops = set(self.token_ids.stop)
        cut = next((j for j, t in enumerate(raw) if t in stops), None)
        ids = raw if cut is None else raw[:cut]
        return GenerationResult(text=self.tokenizer.decode(ids), token_ids=ids, raw_ids=raw,
                                finish_reason="length" if cut is None else "stop", nfe=nfe, commits=commits,
                                seconds=seconds, commit_forwards=commit_forwards)


ASSETS = Path(__file__).parent / "assets"
EMBEDDED = {"default": ASSETS / "default", "default-ar": ASSETS / "default-ar", "default-block": ASSETS / "default-block"}


def resolve_model_path(model: str | Path | None) -> Path:
    if model is not None and not isinstance(model, (str, Path)):
        raise UnmaskError(f"model {model!r} must be a folder path, 'default', 'default-ar' or 'default-block'")
    name = "default" if model is None else str(model)
    if isinstance(model, str) and not model.strip():
        raise UnmaskError(f"model {model!r} is empty; give a checkpoint folder or 'default', 'default-ar', 'default-block'")
    if name in EMBEDDED:
        path = EMBEDDED[name]
        if not (path / "config.json").exists():
            raise UnmaskError(f"the embedded model {name!r} is not in this installation ({path})")
        return path
    return Path(model)


# what an autoregressive model cannot honour: anything but the field's reference value is refused
AR_IGNORED = ("policy", "remasking", "confidence", "threshold", "factor", "gamma", "budget", "cache",
              "refresh_interval", "refresh_tokens", "refresh_below", "refresh_scope",
              "top_k", "top_p", "compat", "alg", "early_stop")
_REFERENCE = GenerationParams()


def check_device(device) -> torch.device:
    """A torch device that exists here, or an UnmaskError naming it."""
    if not isinstance(device, (str, torch.device)):
        raise UnmaskError(f"device {device!r} must be a name such as cpu or cuda")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise UnmaskError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UnmaskError(f"device {device!r}: CUDA is not available on this machine")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise UnmaskError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise UnmaskError(f"device {device!r}: MPS is not available on this machine")
    elif d.type not in ("cpu", "cuda", "mps"):
        raise UnmaskError(f"device {device!r} is not supported; use cpu or cuda")
    return d


def check_token_ids(t: TokenIds, vocab: int, path) -> None:
    """Every special id the checkpoint names lies inside the model's vocabulary."""
    for name, value in (("mask", t.mask), ("eos", t.eos), ("pad", t.pad), ("bos", t.bos)):
        if value is not None and not 0 <= value < vocab:
            raise CheckpointError(f"{path}: {name} token id {value} is outside the model's vocabulary [0, {vocab})")
    bad = [i for i in t.stop if not 0 <= i < vocab]
    if bad:
        raise CheckpointError(f"{path}: stop token id {bad[0]} is outside the model's vocabulary [0, {vocab})")
    if t.mask in t.stop or t.mask == t.pad:
        raise CheckpointError(f"{path}: the mask token id {t.mask} is also an end-of-text or padding id")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
