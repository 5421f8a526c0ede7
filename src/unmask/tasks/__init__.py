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


def train_stream(task: str, seed: int, exclude_n: int = 1000) -> Iterator[Example]:
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


__all__ = ["TASKS", "Example", "Score", "score", "held_out", "train_stream", "vocabulary"]
