"""Offline front end: load a checkpoint folder once, generate for batches of prompts."""

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from unmask.compat import get_mode
from unmask.engine.ar import decode_ar
from unmask.engine.loop import Decoded, StepRecord, decode
from unmask.errors import UnmaskError
from unmask.models.base import TokenIds
from unmask.models.loader import load_model, read_json
from unmask.params import MODEL_DEFAULT_KEYS, GenerationParams, resolve_params
from unmask.tokenizer import Tokenizer, resolve_token_ids


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids up to (not including) the first end-of-text token
    raw_ids: list[int]  # the whole generated region of the canvas (MASK where never committed)
    finish_reason: str  # "stop" (end-of-text committed) or "length"
    nfe: int  # forwards this row took part in
    commits: list[int]  # tokens committed at each of those forwards

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
    steps: list[StepRecord]
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
        self.model, self.config = load_model(self.path, dtype=dtype, device=device)
        gen_path = self.path / "generation_config.json"
        self.generation_config = read_json(gen_path) if gen_path.exists() else {}
        self.tokenizer = Tokenizer.from_dir(self.path)
        self.token_ids: TokenIds = resolve_token_ids(self.config, self.generation_config, self.tokenizer)

    @classmethod
    def from_parts(cls, model, tokenizer: Tokenizer, token_ids: TokenIds) -> "LLM":
        """An LLM over an in-memory model (training-time evaluation)."""
        llm = cls.__new__(cls)
        llm.path, llm.config, llm.generation_config = None, {}, {}
        llm.model, llm.tokenizer, llm.token_ids = model, tokenizer, token_ids
        return llm

    @property
    def generation_defaults(self) -> dict:
        """What the checkpoint's generation_config.json recommends: the canvas shape (gen_length,
        block_length, steps) and the diffusion decoding settings (policy, its knobs, cache);
        sampling settings (temperature, top_p, ...) stay the caller's."""
        g = self.generation_config
        return {k: g[k] for k in MODEL_DEFAULT_KEYS if k in g}

    def default_params(self, **given) -> GenerationParams:
        """Checked parameters: `given`, then the checkpoint's recommendations, then unmask's fast
        defaults (threshold 0.9 with DualCache). What `generate` uses when given no parameters."""
        return resolve_params(given, self.generation_defaults, fast=True)

    @property
    def arch(self):
        return self.model.config

    def encode(self, prompts: str | list[str], chat: bool | None = None) -> list[list[int]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        use_chat = self.tokenizer.chat_template is not None if chat is None else chat
        out = []
        for p in prompts:
            if not p.strip():
                raise UnmaskError("empty prompt")
            out.append(self.tokenizer.encode_prompt(p, use_chat))
        return out

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: GenerationParams | None = None,
        chat: bool | None = None,
    ) -> BatchOutput:
        """Prompts are text (tokenised, through the chat template when the tokenizer has one and
        `chat` is not False) or lists of token ids. Without `params`: `default_params()`."""
        params = params.check() if params is not None else self.default_params()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], str)):
            ids = self.encode(prompts, chat)
        else:
            ids = [list(map(int, p)) for p in prompts]
        self._check_prompts(ids, params)
        t0 = time.perf_counter()
        if self.arch.causal:  # an autoregressive twin: KV-cached next-token decoding
            decoded = decode_ar(self.model, self.token_ids, ids, params.gen_length, params.temperature, params.seed)
        else:
            decoded = decode(self.model, self.token_ids, ids, params)
        seconds = time.perf_counter() - t0
        return BatchOutput(self._results(decoded, params), decoded.steps, seconds, decoded.cache, decoded.prompt_len)

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

    def _results(self, d: Decoded, params: GenerationParams) -> list[GenerationResult]:
        gen = d.generated.tolist()
        stops = set(self.token_ids.stop)
        out = []
        for r, raw in enumerate(gen):
            cut = next((j for j, t in enumerate(raw) if t in stops), None)
            ids = raw if cut is None else raw[:cut]
            out.append(
                GenerationResult(
                    text=self.tokenizer.decode(ids),
                    token_ids=ids,
                    raw_ids=raw,
                    finish_reason="length" if cut is None else "stop",
                    nfe=d.row_nfe[r],
                    commits=d.row_commits[r],
                )
            )
        return out


ASSETS = Path(__file__).parent / "assets"
EMBEDDED = {"default": ASSETS / "default", "default-ar": ASSETS / "default-ar"}


def resolve_model_path(model: str | Path | None) -> Path:
    name = "default" if model is None else str(model)
    if name in EMBEDDED:
        path = EMBEDDED[name]
        if not (path / "config.json").exists():
            raise UnmaskError(f"the embedded model {name!r} is not in this installation ({path})")
        return path
    return Path(model)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
