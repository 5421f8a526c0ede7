"""The embedded task suite: deterministic train/test splits and exact scoring."""

import random
from collections.abc import Iterator
from dataclasses import dataclass

from unmask.tasks.suite import GENERATORS, Example, vocabulary

TASKS = tuple(GENERATORS)
TEST_SEED = 1_000_003


def held_out(task: str, n: int = 200) -> list[Example]:
    """The first n distinct examples of the held-out stream (the same for every caller)."""
    if task not in GENERATORS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    rng = random.Random(f"{TEST_SEED}:{task}")
    seen, out = set(), []
    while len(out) < n:
        ex = GENERATORS[task](rng)
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            out.append(ex)
    return out


# The held-out stream is cut in two (training never sees the first TRAIN_EXCLUDED of it):
# - "selection", examples 0-249 of each task: everything the project has looked at while choosing
#   anything (the bench's first 50, eval.json's 200, the adaptive cache's 50-249, the training-time
#   checks, defaults and thresholds). Choose settings here.
# - "report", examples 250-999: looked at only to report a setting chosen on "selection", with its
#   interval. Nothing is chosen on it.
TRAIN_EXCLUDED = 1000
SPLITS = {"selection": (0, 250), "report": (250, TRAIN_EXCLUDED)}


def split_examples(task: str, split: str = "selection", n: int | None = None) -> list[Example]:
    """The first `n` examples (default: all) of one split of `task`'s held-out stream."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose {', '.join(SPLITS)}")
    first, end = SPLITS[split]
    size = end - first
    if n is None:
        n = size
    if not 0 < n <= size:
        raise ValueError(f"split {split!r} holds {size} examples of each task, not {n}")
    return held_out(task, first + n)[first:]


def train_stream(task: str, seed: int, exclude_n: int = TRAIN_EXCLUDED) -> Iterator[Example]:
    """Endless training examples; any prompt in the first `exclude_n` test examples is skipped,
    so train and test never share a prompt."""
    excluded = {ex.prompt for ex in held_out(task, exclude_n)}
    rng = random.Random(f"{seed}:{task}")
    while True:
        ex = GENERATORS[task](rng)
        if ex.prompt not in excluded:
            yield ex


@dataclass(frozen=True)
class Score:
    exact: bool  # exact match, or validity for tasks with several answers
    token_accuracy: float  # matching tokens up to end of text (gold + end-of-text token)


def score(example: Example, prediction: str) -> Score:
    pred = prediction.split()
    golds = example.valid or (example.answer,)
    best = None
    for g in golds:
        gold = g.split()
        ref = gold + ["<eot>"]
        got = pred + ["<eot>"]
        hits = sum(1 for j, t in enumerate(ref) if j < len(got) and got[j] == t)
        s = Score(pred == gold, hits / len(ref))
        if best is None or (s.exact, s.token_accuracy) > (best.exact, best.token_accuracy):
            best = s
    return best


__all__ = ["SPLITS", "TASKS", "Example", "Score", "score", "held_out", "split_examples", "train_stream", "vocabulary"]
