"""Pieces the GSM8K, HumanEval and lm-eval runners share."""

import warnings
from dataclasses import dataclass

from unmask.errors import UnmaskWarning


def cut_at_stop(text: str, stops) -> str:
    """The text before the first occurrence of any stop string (lm-eval's post-hoc `until`)."""
    if isinstance(stops, str):
        stops = [stops]
    cut = min((text.find(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]


@dataclass
class Batched:
    results: list  # GenerationResult per prompt, in order
    nfe: float  # forwards per request
    tokens_per_s: float  # generated tokens (up to end of text) per second of decoding
    seconds: float  # decoding time: every forward and the loop; tokenisation excluded


def generate_batched(llm, prompts: list[str], params, batch_size: int, progress=None,
                     suffixes: list[str] | None = None) -> Batched:
    """Plain-text prompts (no chat template) decoded `batch_size` at a time; `progress(k)` after
    each batch of k prompts; `suffixes`: the text after each prompt's hole (infilling)."""
    warn_unknown_words(llm, prompts)
    results, seconds = [], 0.0
    for out in llm.generate_batches(prompts, params, batch_size, chat=False, unknown_words="ignore", progress=progress,
                                    suffixes=suffixes):
        seconds += out.seconds
        results += out.results
    tokens = sum(r.num_tokens for r in results)
    nfe = sum(r.nfe for r in results) / max(len(results), 1)
    return Batched(results, nfe, tokens / seconds if seconds else 0.0, seconds)


def warn_unknown_words(llm, prompts: list[str]) -> int:
    """One warning for a whole run whose prompts hold words the tokenizer cannot represent (a
    word-level vocabulary such as the embedded model's on GSM8K); returns how many prompts do."""
    hits = [w for p in prompts for w in llm.tokenizer.unknown_words(p)[:1]]
    if hits:
        warnings.warn(UnmaskWarning(f"{len(hits)} of {len(prompts)} prompts hold words outside the model's "
                                    f"vocabulary (read as its unknown token), e.g. {hits[0]!r}"), stacklevel=2)
    return len(hits)
