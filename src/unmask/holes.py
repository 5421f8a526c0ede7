"""Templates with holes (infilling): text with markers where the model writes.

    def area(r):
        <|hole:24|>
        return a

`<|hole:N|>` is a hole of N tokens; `<|hole|>` one of gen_length tokens. The text before the
first hole is the prompt (tokenised as a prompt is, with the tokenizer's own special tokens), the
text after the last hole the suffix, and the text between holes is fixed text inside the
generated region; every piece after the prompt is tokenised on its own, without special tokens
(so a piece joins its neighbours at a token boundary: cut templates at line starts for
byte-level BPE, as the code models' tokenizer keeps a newline its own token).

One hole is prompt + hole + suffix (`LLM.generate(..., suffix=)`: the request's blocks and
schedule as given). Several holes decode their region (first hole to last hole) as one block
whose schedule spreads over the hole positions only, at the tokens per step the parameters
imply (steps / gen_length); the row runs to the end of its region (an end of text ends a hole,
not the row), and a policy that revises committed tokens is refused (it could rewrite the fixed
text). Each hole's text is cut at its first end-of-text token (end-of-text padding is how a fixed
-length hole holds shorter text) and, where its length is bounded (`hole_length` "bound", the
native default), where it goes on with the text after it (the next fixed text, or the suffix after
the last hole: sampler.stops.suffix_overlap), as one hole's middle is."""

import math
import re
from dataclasses import dataclass, replace

from unmask.errors import UnmaskError
from unmask.params import GenerationParams
from unmask.sampler.stops import suffix_overlap
from unmask.tokenizer import Tokenizer

MARKER = re.compile(r"<\|hole(?::([0-9]+))?\|>")  # ASCII digits only (\d also matches other scripts' digits)
MAX_HOLES = 64
MAX_HOLE = 1_000_000  # no canvas holds more (a model's own positions are checked later, by name)


@dataclass(frozen=True)
class Template:
    """A template as token ids: prompt, then the region (the mask id at each hole position, the
    fixed text between holes), then the suffix."""

    prompt: list[int]
    region: list[int]
    suffix: list[int]
    holes: tuple[tuple[int, int], ...]  # each hole's [start, end) in the region

    @property
    def fill(self) -> list[int] | None:
        """The region's starting tokens for the engine (Engine.add_request fill=), None for one
        hole (an all-masked region)."""
        return self.region if len(self.holes) > 1 else None

    @property
    def masks(self) -> int:
        return sum(e - s for s, e in self.holes)

    def round(self, h: int, filled: list[list[int]]) -> "Template":
        """Hole `h` as a template of one hole (several holes whose lengths are bounds decode one
        after another, left to right): the prompt, the fixed text and the holes before it
        (`filled`: their texts), hole h, and as its suffix the fixed text up to the next hole."""
        s, e = self.holes[h]
        before = region_ids(replace(self, holes=self.holes[:h], region=self.region[:s]), filled[:h])
        return Template(self.prompt + before, [self.region[s]] * (e - s), self.after(h), ((0, e - s),))

    def after(self, h: int) -> list[int]:
        """The fixed text after hole `h` (the suffix after the last; empty between adjacent holes)."""
        return list(self.region[self.holes[h][1] : self.holes[h + 1][0]]) if h + 1 < len(self.holes) else self.suffix


def has_holes(text: str) -> bool:
    return isinstance(text, str) and MARKER.search(text) is not None


def split(text: str) -> tuple[list[str], list[int | None]]:
    """The template's text pieces (one more than holes) and each hole's length (None: gen_length).
    A malformed marker (`<|hole:0|>`, `<|hole:x|>`) is an error naming it."""
    if not isinstance(text, str):
        raise UnmaskError(f"a template is text, not {type(text).__name__}")
    bad = re.search(r"<\|hole[^|]*\|>", MARKER.sub("", text))
    if bad:
        raise UnmaskError(f"template: {bad.group(0)!r} is not a hole marker; write <|hole|> or <|hole:N|> "
                          "with N a positive number of tokens")
    pieces, lengths, at = [], [], 0
    for m in MARKER.finditer(text):
        pieces.append(text[at : m.start()])
        n = m.group(1)
        if n is not None and int(n) < 1:
            raise UnmaskError(f"template: hole {len(lengths)} {m.group(0)!r} has no room; N must be at least 1")
        if n is not None and (len(n) > 7 or int(n) > MAX_HOLE):
            raise UnmaskError(f"template: hole {len(lengths)} {m.group(0)[:40]!r} is longer than any canvas "
                              f"(at most {MAX_HOLE:,} tokens; the model's own limit is lower)")
        lengths.append(None if n is None else int(n))
        at = m.end()
    pieces.append(text[at:])
    if not lengths:
        raise UnmaskError("template has no hole; mark each with <|hole|> or <|hole:N|>")
    if len(lengths) > MAX_HOLES:
        raise UnmaskError(f"template has {len(lengths)} holes; at most {MAX_HOLES}")
    return pieces, lengths


def encode(tokenizer: Tokenizer, text: str, mask_id: int, gen_length: int) -> Template:
    """A template's ids (see the module's notes). An empty piece between two holes joins them."""
    pieces, lengths = split(text)
    if not pieces[0].strip():
        raise UnmaskError("template: give text before the first hole (it is the prompt)")
    unknown = [w for p in pieces for w in tokenizer.unknown_words(p)]
    if unknown:
        raise UnmaskError(f"template: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}"
                          + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""))
    prompt = tokenizer.encode_prompt(pieces[0], False)
    region: list[int] = []
    holes = []
    for i, n in enumerate(lengths):
        if i:
            region += tokenizer.encode(pieces[i], add_special_tokens=False)
        start = len(region)
        region += [mask_id] * (gen_length if n is None else n)
        holes.append((start, len(region)))
    suffix = tokenizer.encode(pieces[-1], add_special_tokens=False) if pieces[-1] else []
    return Template(prompt, region, suffix, tuple(holes))


def params_for(params: GenerationParams, t: Template, block_size: int | None = None) -> GenerationParams:
    """The parameters a template decodes with: gen_length is its region; one hole keeps the
    blocks it was given when block_length divides the hole (else one block), several holes are
    one block; steps keep the given tokens per step (steps / gen_length), on the hole positions.
    `block_size`: a block-diffusion model's attention blocks (its one hole is at the end: blocks
    as given, aligned to them by `accept`); parameters without steps (a renoising model's, or a
    block model's default schedule) take none."""
    G = len(t.region)
    if block_size:
        tps = params.gen_length // params.steps if params.steps and params.gen_length % params.steps == 0 else 0
        return replace(params, gen_length=G, steps=G // tps if tps and G % tps == 0 else None)
    if len(t.holes) == 1 and G % params.block_length == 0:
        blocks = G // params.block_length
        per_block = params.block_length
    else:
        blocks, per_block = 1, t.masks
    if params.steps is None:
        return replace(params, gen_length=G, block_length=G // blocks)
    rate = params.total_steps / params.gen_length
    steps = blocks * min(per_block, max(1, math.ceil(per_block * rate)))
    return replace(params, gen_length=G, block_length=G // blocks, steps=steps)


def ends_at_suffix(params: GenerationParams) -> bool:
    """Whether a hole's middle ends where it goes on with the text after it (`hole_length` "bound",
    the native default); an exact hole has its length, a growing one ends where the model deletes,
    a consensus hole is the exact hole of the length kept."""
    return params.hole_length not in ("exact", "grow", "consensus")


def cut_hole(t: Template, h: int, ids: list[int], stops, bounded: bool) -> tuple[list[int], bool, int]:
    """Hole `h`'s text from its decoded ids so far (its committed prefix): (the text's ids, whether
    the hole has ended — an end of text, or with `bounded` its going on with the text after it —,
    how many of those ids are final while the hole is still being written: the rest may yet begin
    the text after it)."""
    stop = next((k for k, tok in enumerate(ids) if tok in stops), None)
    ids = list(ids[:stop])
    if not bounded:
        return ids, stop is not None, len(ids)
    at, safe = suffix_overlap(ids, t.after(h))
    if at is not None:
        return ids[:at], True, at
    return ids, stop is not None, len(ids) if stop is not None else safe


def hole_ids(t: Template, raw: list[int], stop_ids, bounded: bool = False) -> list[list[int]]:
    """Each hole's generated ids from the decoded region, cut at the hole's first stop id (and,
    `bounded`, where it goes on with the text after it)."""
    stops = set(stop_ids)
    return [cut_hole(t, h, raw[s:e], stops, bounded)[0] for h, (s, e) in enumerate(t.holes)]


def region_ids(t: Template, holes: list[list[int]]) -> list[int]:
    """The region's ids with each hole's text in place (its end-of-text padding dropped)."""
    out, at = [], 0
    for (s, e), ids in zip(t.holes, holes):
        out += t.region[at:s] + ids
        at = e
    return out + t.region[at:]


def fill_in(text: str, hole_texts: list[str]) -> str:
    """The template's own text with each hole marker replaced by that hole's text (the fixed
    text exactly as written, not re-decoded)."""
    pieces, lengths = split(text)
    if len(hole_texts) != len(lengths):
        raise UnmaskError(f"{len(hole_texts)} hole texts for a template of {len(lengths)} holes")
    return "".join(p + h for p, h in zip(pieces, hole_texts)) + pieces[-1]
