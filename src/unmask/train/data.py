"""Tokenizer and batches for the task suite.

Layout is decoding's, by construction (one function, unmask.canvas.left_padded):
[pad.. BOS prompt | answer, end-of-text padding to gen_length]. Prompts are left-padded with
<|pad|> (masked out of attention, positions counted from the first real token), so a trained
model sees at training time the canvas it decodes at inference time.
"""

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from unmask.canvas import left_padded
from unmask.tasks import TASKS, Example, held_out
from unmask.tasks.suite import GENERATORS, vocabulary

BOS, EOS, MASK, PAD = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|pad|>"
SPECIALS = [BOS, EOS, MASK, PAD]
EXPAND = "<|expand|>"  # DreamOn's: a mask that stands for two or more tokens (span_expand training)


def build_tokenizer() -> Tokenizer:
    """Word-level vocabulary: every task word (digits are single tokens) plus four specials."""
    vocab = {w: i for i, w in enumerate(SPECIALS + vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return tok


def save_tokenizer_files(tok: Tokenizer, folder: Path) -> None:
    import json

    tok.save(str(folder / "tokenizer.json"))
    cfg = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "mask_token": MASK,
           "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "mask_token")}, indent=2))


class TaskSampler:
    """Seeded, resumable stream of training examples from a weighted task mixture. Prompts that
    occur in the first `exclude_n` held-out examples of a task are never produced."""

    def __init__(self, weights: dict[str, float], seed: int, exclude_n: int = 1000) -> None:
        unknown = set(weights) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {', '.join(TASKS)}")
        self.names = sorted(weights)
        self.weights = [weights[n] for n in self.names]
        self.held_out = {n: {ex.prompt for ex in held_out(n, exclude_n)} for n in self.names}
        self.rng = random.Random(seed)

    def next(self) -> Example:
        name = self.rng.choices(self.names, self.weights)[0]
        while True:
            ex = GENERATORS[name](self.rng)
            if ex.prompt not in self.held_out[name]:
                return ex

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)


@dataclass
class Batch:
    ids: torch.Tensor  # (B, P + G)
    positions: torch.Tensor  # (B, P + G)
    key_mask: torch.Tensor | None  # (B, P + G)
    prompt_len: int  # P
    answer_len: torch.Tensor  # (B,) answer tokens before end-of-text


def make_batch(examples: list[Example], tok: Tokenizer, gen_length: int) -> Batch:
    return _batch(_encode(examples, tok, gen_length), tok, gen_length)


def make_batches(examples: list[Example], tok: Tokenizer, gen_length: int) -> list[Batch]:
    """The examples as at most two batches of similar prompt length (a word problem's prompt is
    three times a copy prompt's): the split that pads the fewest positions. Padding is masked out
    of attention and loss, so the two batches give the same gradient as one, for less compute."""
    return group_batches(_encode(examples, tok, gen_length), tok, gen_length)


def group_batches(enc: list[tuple[list[int], list[int]]], tok: Tokenizer, gen_length: int) -> list[Batch]:
    """(prompt ids, answer ids) pairs as make_batches groups them."""
    enc = sorted(enc, key=lambda e: len(e[0]))
    lens = [len(p) for p, _ in enc]
    B = len(enc)
    best, cut = B * lens[-1], B
    for k in range(1, B):
        cost = k * lens[k - 1] + (B - k) * lens[-1]
        if cost < best:
            best, cut = cost, k
    groups = [enc[:cut], enc[cut:]] if cut < B else [enc]
    return [_batch(g, tok, gen_length) for g in groups]


def _encode(examples: list[Example], tok: Tokenizer, gen_length: int) -> list[tuple[list[int], list[int]]]:
    out = []
    for ex in examples:
        p = tok.encode(ex.prompt).ids
        a = tok.encode(ex.answer, add_special_tokens=False).ids
        if len(a) >= gen_length:
            from unmask.errors import UnmaskError

            raise UnmaskError(f"gen_length {gen_length}: a {ex.task} answer of {len(a)} tokens and its end of text do "
                              f"not fit ({ex.answer[:60]!r}); use --gen-length {len(a) + 1} or more", param="gen_length")
        out.append((p, a))
    return out


def _batch(enc: list[tuple[list[int], list[int]]], tok: Tokenizer, gen_length: int) -> Batch:
    """Decoding's own canvas layout (unmask.canvas.left_padded), with each answer and its
    end-of-text padding written where decoding has masks."""
    eos, pad = tok.token_to_id(EOS), tok.token_to_id(PAD)
    ids, positions, key_mask = left_padded([p for p, _ in enc], gen_length, pad, eos)
    P = ids.shape[1] - gen_length
    for r, (_, a) in enumerate(enc):
        ids[r, P : P + len(a)] = torch.tensor(a)
    return Batch(ids, positions, key_mask, P, torch.tensor([len(a) for _, a in enc]))
