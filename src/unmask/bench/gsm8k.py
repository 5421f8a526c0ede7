"""GSM8K offline, scored as lm-evaluation-harness scores its `gsm8k` task.

Prompt: 5-shot "Question: {q}\\nAnswer: {worked answer}" shots joined by blank lines, then
"Question: {q}\\nAnswer:". The shots are the first five training problems (lm-eval samples them
with a fixed seed; the format is the same). Generation stops at "Question:", "</s>" or
"<|im_end|>". Two extractions: strict ("#### N") and flexible (the last number); exact match
after removing commas, "$", everything up to "#### " and a trailing period, ignoring case.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"
UNTIL = ("Question:", "</s>", "<|im_end|>")
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))
INVALID = "[invalid]"


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the worked solution ending in "#### N"


def load(split: str = "test", path: str | Path | None = None) -> list[Problem]:
    """The packaged copy (test split, few-shot pool), or `path`/{split}.jsonl of a full copy."""
    if path is not None:
        file = Path(path) / f"{split}.jsonl"
    else:
        file = DATA / ("gsm8k_test.jsonl" if split == "test" else "gsm8k_train_first8.jsonl")
    with open(file, encoding="utf-8") as f:
        return [Problem(**json.loads(line)) for line in f if line.strip()]


def build_prompt(question: str, shots: list[Problem]) -> str:
    parts = [f"Question: {s.question}\nAnswer: {s.answer}" for s in shots]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def truncate(completion: str) -> str:
    """Cut at the first stop string, as lm-eval does after generating a fixed length."""
    cut = min((completion.find(u) for u in UNTIL if u in completion), default=len(completion))
    return completion[:cut]


def strict_extract(text: str) -> str:
    m = STRICT.search(text)
    return m.group(1) if m else INVALID


def flexible_extract(text: str) -> str:
    matches = FLEXIBLE.findall(text)
    if not matches:
        return INVALID
    last = matches[-1]
    return next((g for g in last if g), INVALID) if isinstance(last, tuple) else last


def normalise(text: str) -> str:
    for rx in IGNORE:
        text = rx.sub("", text)
    return text.strip().lower()


def gold(problem: Problem) -> str:
    return normalise(problem.answer)


def score(completion: str, problem: Problem) -> dict[str, bool]:
    text = truncate(completion)
    target = gold(problem)
    return {"strict": normalise(strict_extract(text)) == target,
            "flexible": normalise(flexible_extract(text)) == target}
