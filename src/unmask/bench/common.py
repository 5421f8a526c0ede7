"""Pieces the GSM8K, HumanEval and lm-eval runners share."""

from dataclasses import dataclass


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


def generate_batched(llm, prompts: list[str], params, batch_size: int, progress=None) -> Batched:
    """Plain-text prompts (no chat template) decoded `batch_size` at a time; `progress(k)` after
    each batch of k prompts."""
    results, seconds = [], 0.0
    for i in range(0, len(prompts), batch_size):
        out = llm.generate(prompts[i : i + batch_size], params, chat=False)
        seconds += out.seconds
        results += out.results
        if progress:
            progress(len(out.results))
    tokens = sum(r.num_tokens for r in results)
    nfe = sum(r.nfe for r in results) / max(len(results), 1)
    return Batched(results, nfe, tokens / seconds if seconds else 0.0, seconds)
