"""Offline front end: load a checkpoint folder once, generate for batches of prompts."""

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from unmask.engine.ar import decode_ar
from unmask.engine.loop import Decoded, StepRecord, decode
from unmask.errors import UnmaskError
from unmask.models.base import TokenIds
from unmask.models.loader import load_model, read_json
from unmask.params import GenerationParams
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
    def tokens_per_forward(self) -> float:
        """Tokens up to and including end of text per forward (the padding after it is not counted)."""
        n = len(self.token_ids) + (self.finish_reason == "stop")
        return n / self.nfe if self.nfe else 0.0


@dataclass
class BatchOutput:
    results: list[GenerationResult]
    steps: list[StepRecord]
    seconds: float  # wall time of decode (every forward and the loop), tokenisation excluded
    cache: str

    @property
    def nfe(self) -> int:
        return len(self.steps)


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
        """gen_length / block_length / steps recommended by the checkpoint's generation_config.json."""
        g = self.generation_config
        return {k: g[k] for k in ("gen_length", "block_length", "steps") if isinstance(g.get(k), int)}

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
        `chat` is not False) or lists of token ids."""
        params = (params or GenerationParams()).check()
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
        return BatchOutput(self._results(decoded, params), decoded.steps, seconds, decoded.cache)

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
        if params.compat in ("fast-dllm", "llada") and len({len(p) for p in ids}) > 1:
            raise UnmaskError(f"compat {params.compat!r} needs equal-length prompts (the reference does not mask padding)")
        if params.compat in ("fast-dllm", "llada") and self.arch.family != "llada":
            raise UnmaskError(f"compat {params.compat!r} reproduces the LLaDA sampler; this is a {self.arch.family} model")
        if params.compat == "dream" and self.arch.family != "dream":
            raise UnmaskError(f"compat 'dream' reproduces Dream's diffusion_generate; this is a {self.arch.family} model")

    def _results(self, d: Decoded, params: GenerationParams) -> list[GenerationResult]:
        gen = d.generated.tolist()
        stops = set(self.token_ids.stop) | {self.token_ids.eos}
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
