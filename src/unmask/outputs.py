"""What `LLM.generate` returns: one result per prompt, and the batch with its forwards."""

from dataclasses import dataclass

from unmask.sampler.stops import first_stop_index, suffix_overlap
from unmask.trace import ForwardRecord


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids up to (not including) the first end-of-text token
    raw_ids: list[int]  # the whole generated region of the canvas (MASK where never committed)
    finish_reason: str  # "stop" (end-of-text committed) or "length"
    nfe: int  # forwards this row took part in
    commits: list[int]  # tokens committed at each of those forwards
    seconds: float = 0.0  # from the start of decoding until this request finished (its latency)
    seal_forwards: int = 0  # block models: forwards that also wrote a finished block's exact K/V
    edits: int = 0  # committed tokens this row's policy replaced by others (token-to-token editing)
    remasked: int = 0  # committed tokens this row's policy masked again (remasking)
    draft_forwards: int = 0  # speculative decoding: drafter forwards (nfe counts the target's forwards)
    # a template (LLM.infill): each hole's text, cut at its end of text; `text` is then the region
    # with the holes filled (fixed text between them kept), `token_ids` the holes' ids, and
    # `hole_stops` how many holes ended with an end of text (finish_reason "stop": all of them)
    holes: list[str] | None = None
    hole_stops: int = 0
    # structured output: frontier tokens the grammar's plan replaced (no room left to finish
    # otherwise), and committed tokens the grammar rejected and masked again
    grammar_forced: int = 0
    grammar_rejected: int = 0
    # logprobs (LLM.generate(logprobs=k)): for each of token_ids, (its log-probability, [(id,
    # log-probability)] of the k most likely tokens); None when not asked for
    logprobs: list | None = None

    @property
    def num_tokens(self) -> int:
        """Generated tokens up to and including end of text (of each hole, for a template): the
        count behind every tokens/s and tokens-per-forward figure (the end-of-text padding after
        it is never counted)."""
        return len(self.token_ids) + (self.hole_stops if self.holes is not None else self.finish_reason == "stop")

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / self.nfe if self.nfe else 0.0


_COUNTERS = ("seal_forwards", "edits", "remasked", "draft_forwards", "grammar_forced", "grammar_rejected")


@dataclass
class BatchOutput:
    results: list[GenerationResult]
    steps: list[ForwardRecord]  # every batched forward
    seconds: float  # wall time of decode (every forward and the loop), tokenisation excluded
    cache: str
    prompt_len: int  # columns before the generation region (the longest prompt)

    @property
    def nfe(self) -> int:
        """Batched forwards of the model (a speculative decode's drafter forwards are not counted:
        `draft_forwards`)."""
        return sum(1 for s in self.steps if s.kind != "draft")

    @property
    def draft_forwards(self) -> int:
        return sum(1 for s in self.steps if s.kind == "draft")

    @property
    def tokens(self) -> int:
        """Generated tokens of all rows, each up to and including its end of text."""
        return sum(r.num_tokens for r in self.results)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0


def result_of(tokenizer, stop_ids, raw: list[int], nfe: int, commits: list[int], seconds: float,
              suffix: list[int] | None = None, **counters) -> GenerationResult:
    """A GenerationResult from a generated region: cut at the first stop id, detokenised; with
    `suffix` (a hole whose length is bounded) also where it goes on with the suffix's own text
    (sampler.stops.suffix_overlap).
    `counters`: what a row kind counted (unmask.engine.kind.Stats) by name; those the result has
    a field for are kept (seal_forwards, edits, remasked, draft_forwards)."""
    cut = first_stop_index(raw, set(stop_ids))
    ids = raw if cut is None else raw[:cut]
    if suffix:
        at, _ = suffix_overlap(ids, suffix)
        if at is not None:
            ids, cut = ids[:at], at
    return GenerationResult(text=tokenizer.decode(ids), token_ids=ids, raw_ids=raw,
                            finish_reason="length" if cut is None else "stop", nfe=nfe, commits=commits,
                            seconds=seconds, **{k: v for k, v in counters.items() if k in _COUNTERS})
