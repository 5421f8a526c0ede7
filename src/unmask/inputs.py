"""What `LLM.generate` takes as prompts: text (tokenised, through the chat template when the
tokenizer has one) or token-id lists, each checked and every mistake named."""

import numbers

import torch

from unmask.compat import get_mode
from unmask.errors import UnmaskError
from unmask.models.base import ArchConfig, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.policy import POLICIES
from unmask.tokenizer import Tokenizer


def encode(tokenizer: Tokenizer, prompts: str | list[str], chat: bool | None = None,
           unknown_words: str = "error", max_positions: int | None = None) -> list[list[int]]:
    """Text prompts as token ids. Words the tokenizer cannot represent (it would read them as its
    unknown token) are named in an error, or with unknown_words="ignore" let through (the
    evaluation harnesses count them and warn once per run). With `max_positions`, text longer
    than any tokenisation of that many positions is refused before it is tokenised."""
    if unknown_words not in ("error", "ignore"):
        raise UnmaskError(f"unknown_words {unknown_words!r} must be 'error' or 'ignore'")
    if isinstance(prompts, str):
        prompts = [prompts]
    if chat is not None and not isinstance(chat, bool):
        raise UnmaskError(f"chat {chat!r} must be True, False or None")
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    out = []
    for r, p in enumerate(prompts):
        if not isinstance(p, str):
            raise UnmaskError(f"prompt {r} is a {type(p).__name__}; prompts are all strings or all lists of token ids")
        if not p.strip():
            raise UnmaskError(f"prompt {r} is empty")
        if max_positions is not None:
            tokenizer.check_length(p, max_positions, f"prompt {r}" if len(prompts) > 1 else "prompt")
        unknown = tokenizer.unknown_words(p) if unknown_words == "error" else []
        if unknown:
            raise UnmaskError(f"prompt {r}: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}"
                              + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""))
        out.append(tokenizer.encode_prompt(p, use_chat))
    return out


def suffix_ids(tokenizer: Tokenizer, suffix, prompts, n: int, unknown_words: str = "error") -> list[list[int]] | None:
    """The text after each prompt's hole (infilling), as token ids without special tokens: a
    string for a single text prompt, or one string or id list per prompt. None: no suffix.
    Unknown words: as for prompts (`encode`)."""
    if suffix is None:
        return None
    if isinstance(suffix, str):
        if not isinstance(prompts, str) and n != 1:
            raise UnmaskError(f"suffix is one string for {n} prompts; give one suffix per prompt")
        suffix = [suffix]
    if not isinstance(suffix, (list, tuple)) or len(suffix) != n:
        raise UnmaskError(f"suffix must be one string or id list per prompt ({n}), not "
                          f"{len(suffix) if isinstance(suffix, (list, tuple)) else type(suffix).__name__}")
    out = []
    for r, s in enumerate(suffix):
        if isinstance(s, str):
            unknown = tokenizer.unknown_words(s) if unknown_words == "error" else []
            if unknown:
                raise UnmaskError(f"suffix {r}: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}")
            out.append(tokenizer.encode(s, add_special_tokens=False))
        elif isinstance(s, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                  for t in s):
            out.append([int(t) for t in s])
        else:
            raise UnmaskError(f"suffix {r} must be a string or a list of token ids, not {type(s).__name__}")
    return out


def prompt_ids(tokenizer: Tokenizer, prompts, chat, unknown_words: str,
               max_positions: int | None = None) -> list[list[int]]:
    """Any accepted form of prompts -> a list of token-id lists."""
    if isinstance(prompts, str):
        return encode(tokenizer, prompts, chat, unknown_words, max_positions)
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
        return encode(tokenizer, list(prompts), chat, unknown_words, max_positions)
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


def check_suffix(suffix: list[int], params: GenerationParams, arch: ArchConfig, tokens: TokenIds,
                 prompt_len: int, takes) -> None:
    """Text after the hole (infilling): a full-attention masked model sees it natively; an
    autoregressive model with fill-in-the-middle tokens reads it laid out prefix-suffix-middle
    (`layout`); a block or renoising model, or an autoregressive one without those tokens, cannot
    see text after the hole. LLaDA's, Fast-dLLM v1's and Dream's reference modes decode it as
    their samplers decode a canvas holding it (the other reference modes reproduce prompt-only
    samplers). Ids inside the vocabulary, no mask token, the canvas within the model's positions.
    `takes`: the row kind's contract on this model (engine/kind.py Takes)."""
    if not suffix:
        return
    takes.need("suffix")
    if params.compat is not None and not get_mode(params.compat).takes_suffix:
        raise UnmaskError(f"compat {params.compat!r} reproduces a prompt-only sampler; a suffix decodes natively "
                          "(or with compat llada, fast-dllm, dream or open-dcoder, whose samplers decode any canvas)")
    bad = [t for t in suffix if not 0 <= t < arch.vocab_size]
    if bad:
        raise UnmaskError(f"suffix: token id {bad[0]} is outside the vocabulary [0, {arch.vocab_size})")
    if tokens.mask in suffix:
        raise UnmaskError(f"suffix contains the mask token id {tokens.mask}")
    if params.hole_length == "grow":
        check_grow(params, tokens, takes)
    if params.hole_length == "consensus" and takes.psm:
        raise UnmaskError("hole_length 'consensus' decodes the hole at several exact lengths: a diffusion model's; "
                          "an autoregressive model ends its middle itself (use 'bound')", param="hole_length")
    extra = 3 if takes.psm else 0  # the three fill-in-the-middle markers
    if prompt_len + params.gen_length + len(suffix) + extra > arch.max_positions:
        raise UnmaskError(f"{prompt_len} prompt tokens + gen_length {params.gen_length} + {len(suffix)} suffix tokens "
                          f"exceeds the model's maximum of {arch.max_positions} positions")


def check_grow(params: GenerationParams, tokens: TokenIds, takes) -> None:
    """A hole that grows (engine/grow.py) needs a masked model trained with an expand token, a
    cache whose refresh at a block start recomputes what an edit moves, and a policy that does
    not revise committed tokens (an edit could write the expand token)."""
    if tokens.expand is None or takes.psm:
        raise UnmaskError("hole_length 'grow' needs a diffusion model trained with an expand token (DreamOn's "
                          "<|expand|>); this model has none: use 'bound' or 'exact'", param="hole_length")
    if params.cache not in GROW_CACHES:
        raise UnmaskError(f"cache {params.cache!r} with hole_length 'grow': its K/V would not follow the hole's "
                          f"edits; use {', '.join(GROW_CACHES)}", param="cache")
    if POLICIES[params.policy].revises:
        raise UnmaskError(f"policy {params.policy!r} revises committed tokens; a hole that grows takes a policy that "
                          "does not", param="policy")


GROW_CACHES = ("none", "prefix", "dual", "adaptive")  # each refreshes at a block start (engine/grow.py)


def check_fill(fill: list[int] | None, params: GenerationParams, arch: ArchConfig, tokens: TokenIds,
               revises: bool, takes) -> None:
    """A generated region that starts with fixed text between holes (a template with several
    holes, unmask.holes): a full-attention masked model's, natively, one block over the region
    (its schedule spreads over the holes), a policy that never revises committed tokens (it could
    rewrite the fixed text), ids inside the vocabulary."""
    if fill is None:
        return
    takes.need("template")
    if len(fill) != params.gen_length:
        raise UnmaskError(f"the region's {len(fill)} tokens differ from gen_length {params.gen_length}")
    if params.block_length != params.gen_length:
        raise UnmaskError(f"block_length {params.block_length}: several holes decode their region of "
                          f"{params.gen_length} tokens as one block")
    if tokens.mask not in fill:
        raise UnmaskError("the region has no hole (no mask id)")
    if revises:
        raise UnmaskError(f"policy {params.policy!r} revises committed tokens and could rewrite the fixed text "
                          "between holes; use a policy that only commits (threshold, fixed, factor, ...)")
    bad = [t for t in fill if not 0 <= t < arch.vocab_size]
    if bad:
        raise UnmaskError(f"region: token id {bad[0]} is outside the vocabulary [0, {arch.vocab_size})")


def layout(prompt: list[int], suffix: list[int], takes, tokens: TokenIds) -> tuple[list[int], list[int]]:
    """(prompt, suffix) as the model reads them: rows that read text after a hole laid out
    prefix-suffix-middle (`takes.psm`, the row kind's contract: an autoregressive model with
    fill-in-the-middle tokens) get [BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle> and
    write the middle (as it was trained: unmask.train.code); any other rows read them unchanged."""
    if not suffix or not takes.psm:
        return prompt, suffix
    pre, suf, mid = tokens.fim
    head = [prompt[0]] if prompt and prompt[0] == tokens.bos else []
    return head + [pre] + prompt[len(head):] + [suf] + suffix + [mid], []


def check_prompts(ids: list[list[int]], params: GenerationParams, arch: ArchConfig, tokens: TokenIds) -> None:
    """Token ids inside the vocabulary, no mask token, the canvas within the model's positions,
    and what a reference mode requires of its prompts."""
    if not ids:
        raise UnmaskError("no prompts given")
    vocab = arch.vocab_size
    unconditional = params.compat is not None and get_mode(params.compat).unconditional
    for r, p in enumerate(ids):
        if not p and not unconditional:  # a reference that samples from nothing takes an empty prompt
            raise UnmaskError(f"prompt {r} is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise UnmaskError(f"prompt {r}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if tokens.mask in p:
            raise UnmaskError(f"prompt {r} contains the mask token id {tokens.mask}")
        if len(p) + params.gen_length > arch.max_positions:
            raise UnmaskError(f"prompt {r}: {len(p)} prompt tokens + gen_length {params.gen_length} exceeds the "
                              f"model's maximum of {arch.max_positions} positions")
    if params.compat is not None:
        get_mode(params.compat).check_prompts(ids, arch.family)


def check_constraint(constraint, params: GenerationParams, takes, tokenizer, holes: bool) -> None:
    """Structured output's refusals by name: the row kinds that do not take a constraint (or not
    sampled), the reference modes (they reproduce unconstrained samplers), holes (a suffix or a
    template), and an engine built without its tokenizer. `takes`: the engine's row kind's contract
    on its model (engine/kind.py Takes)."""
    if params.min_tokens:
        raise UnmaskError(f"min_tokens {params.min_tokens} with structured output: the grammar decides where the "
                          "output may end", param="min_tokens")
    takes.need("constraint", "structured_outputs")
    if params.temperature > 0 and takes.sampled_constraint is not None:
        raise UnmaskError(f"{takes.sampled_constraint} (got {params.temperature})", param="temperature")
    if params.compat is not None:
        raise UnmaskError(f"compat {params.compat!r} reproduces an unconstrained reference sampler; structured "
                          "output decodes natively (drop compat)", param="structured_outputs")
    if holes:
        raise UnmaskError("structured output with a suffix or a template is not supported: the grammar "
                          "constrains an answer written from its start", param="structured_outputs")
    if tokenizer is None:
        raise UnmaskError("structured output needs the model's tokenizer (this engine was built without one)",
                          param="structured_outputs")
