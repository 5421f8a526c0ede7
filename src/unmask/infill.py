"""Templates with holes decoded (LLM.infill): each template checked and shaped for the model
(`template_params`), then decoded whole — one block over a region of exact holes — or, where
the holes' lengths are bounds, hole by hole, left to right (`rounds`: unmask.holes.Template.round),
and each result read back as the template's holes (`template_result`). The server decodes the
same templates on its engine (server/completion.py) with these parameters."""

from dataclasses import replace

from unmask import holes as holes_
from unmask.errors import UnmaskError
from unmask.inputs import check_prompts, check_suffix
from unmask.outputs import BatchOutput, GenerationResult
from unmask.params import GenerationParams


def infill(llm, templates: str | list[str], params: GenerationParams) -> BatchOutput:
    """LLM.infill: `params` resolved for the model (accepted in each template's shape here)."""
    if params.compat is not None:
        raise UnmaskError(f"compat {params.compat!r} reproduces a sampler's batch of one shape; templates decode "
                          "natively (for a reference sampler give the prompt and suffix to generate)")
    texts = [templates] if isinstance(templates, str) else templates
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise UnmaskError("templates must be a string or a non-empty list of strings")
    items = []
    for r, text in enumerate(texts):
        try:
            t = holes_.encode(llm.tokenizer, text, llm.token_ids.mask, params.gen_length)
            p = template_params(llm, params, t)
            check_prompts([t.prompt], p, llm.arch, llm.token_ids)
            for h in range(len(t.holes) if p.hole_length != "exact" else 0):  # each hole's text after it
                check_suffix(t.after(h), p, llm.arch, llm.token_ids, len(t.prompt), llm.takes)
            check_suffix(t.suffix, p, llm.arch, llm.token_ids, len(t.prompt), llm.takes)
        except UnmaskError as e:
            raise UnmaskError(f"template {r}: {e}" if len(texts) > 1 else str(e)) from None
        items.append((t, p))
    if items[0][1].hole_length != "exact":
        return rounds(llm, items, params)
    out = llm._generate_engine([t.prompt for t, _ in items], [p for _, p in items],
                               [t.suffix for t, _ in items], [t.fill for t, _ in items], lockstep=True)
    out.results = [template_result(llm, t, res) for (t, _), res in zip(items, out.results)]
    return out


def rounds(llm, items: list, params: GenerationParams) -> BatchOutput:
    """Templates whose holes' lengths are bounds: hole by hole, left to right (holes.Template
    .round), every template's next hole in one batch per round; each result as if its region
    had been decoded whole (each hole's text, then end-of-text padding up to its bound)."""
    filled: list[list[list[int]]] = [[] for _ in items]
    done: list[list[GenerationResult]] = [[] for _ in items]
    steps, seconds = [], 0.0
    for h in range(max(len(t.holes) for t, _ in items)):
        live = [i for i, (t, _) in enumerate(items) if h < len(t.holes)]
        parts = [items[i][0].round(h, filled[i]) for i in live]
        out = llm._generate_engine([rt.prompt for rt in parts], [template_params(llm, params, rt) for rt in parts],
                                   [rt.suffix for rt in parts], lockstep=True)
        steps += out.steps
        seconds += out.seconds
        for i, res in zip(live, out.results):
            filled[i].append(res.token_ids)
            done[i].append(res)
    eos, results = llm.token_ids.stop[0], []
    for (t, _), ids, parts in zip(items, filled, done):
        raw = t.region[:]
        for (s, e), hole in zip(t.holes, ids):
            raw[s:e] = hole + [eos] * (e - s - len(hole))
        whole = replace(parts[0], raw_ids=raw, nfe=sum(r.nfe for r in parts),
                        commits=sum((r.commits for r in parts), []), seconds=sum(r.seconds for r in parts))
        results.append(template_result(llm, t, whole, bounded=holes_.ends_at_suffix(params)))
    return BatchOutput(results, steps, seconds, params.cache, max(len(t.prompt) for t, _ in items))


def template_params(llm, params: GenerationParams, t: holes_.Template) -> GenerationParams:
    """The parameters template `t` decodes with on this model (holes.params_for), accepted; a
    model whose rows cannot read text after a hole refuses a template with any, first."""
    if t.suffix or len(t.holes) > 1:
        llm.takes.need("suffix")
    return llm.accept(holes_.params_for(params, t, llm.arch.block_size or None))


def template_result(llm, t: holes_.Template, res: GenerationResult, bounded: bool = False) -> GenerationResult:
    """A decoded region as a template's result (GenerationResult.holes); `bounded`: its holes'
    lengths are bounds (holes.cut_hole)."""
    ids = holes_.hole_ids(t, res.raw_ids, llm.token_ids.stop, bounded)
    stops = sum(len(h) < e - s for h, (s, e) in zip(ids, t.holes))
    return replace(res, text=llm.tokenizer.decode(holes_.region_ids(t, ids)), token_ids=sum(ids, []),
                   holes=[llm.tokenizer.decode(h) for h in ids], hole_stops=stops,
                   finish_reason="stop" if stops == len(t.holes) else "length")
