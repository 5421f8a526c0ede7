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

from unmask.bench.common import cut_at_stop, generate_batched

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
        from unmask.files import input_folder

        file = input_folder(path, "--data", "folder holding train.jsonl and test.jsonl") / f"{split}.jsonl"
    else:
        file = DATA / ("gsm8k_test.jsonl" if split == "test" else "gsm8k_train_first8.jsonl")
    from unmask.errors import UnmaskError

    if not file.is_file():
        raise UnmaskError(f"GSM8K file {file} does not exist (--data needs train.jsonl and test.jsonl)")
    out = []
    try:
        with open(file, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not (isinstance(row, dict) and isinstance(row.get("question"), str)
                        and isinstance(row.get("answer"), str)):
                    raise UnmaskError(f"{file}:{n}: each line must be an object with string fields question and answer")
                out.append(Problem(row["question"], row["answer"]))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnmaskError(f"{file} is not JSON lines: {e}") from None
    except OSError as e:
        raise UnmaskError(f"{file} could not be read: {e.strerror or e}") from None
    if not out:
        raise UnmaskError(f"{file} holds no problems")
    return out


def build_prompt(question: str, shots: list[Problem]) -> str:
    parts = [f"Question: {s.question}\nAnswer: {s.answer}" for s in shots]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def truncate(completion: str) -> str:
    """Cut at the first stop string, as lm-eval does after generating a fixed length."""
    return cut_at_stop(completion, UNTIL)


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


@dataclass
class GSM8KResult:
    n: int
    strict: float
    flexible: float
    strict_ci: tuple[float, float]
    flexible_ci: tuple[float, float]
    nfe: float  # forwards per request
    tokens_per_s: float  # generated tokens (up to end of text) per second of decoding
    seconds: float  # decoding time: every forward and the loop; tokenisation excluded
    samples: list[dict]


def run(llm, params, n: int | None = None, shots: int = 5, batch_size: int = 8,
        path: str | Path | None = None, progress=None) -> GSM8KResult:
    """Generate for the first `n` test problems with a `shots`-shot prompt and score both ways."""
    from unmask.bench.stats import wilson_interval
    from unmask.errors import UnmaskError

    pool = load("train", path)
    if not 0 <= shots <= len(pool):
        raise UnmaskError(f"shots {shots} must be between 0 and {len(pool)} (the few-shot pool)")
    if n is not None and n < 1:
        raise UnmaskError(f"n {n} must be a positive integer")
    problems = load("test", path)[:n]
    gen = generate_batched(llm, [build_prompt(p.question, pool[:shots]) for p in problems], params, batch_size, progress)
    samples = [{"question": p.question, "gold": gold(p), "completion": truncate(r.text), **score(r.text, p)}
               for p, r in zip(problems, gen.results)]
    k = len(samples)
    ks = sum(s["strict"] for s in samples)
    kf = sum(s["flexible"] for s in samples)
    return GSM8KResult(k, ks / k, kf / k, wilson_interval(ks, k), wilson_interval(kf, k), gen.nfe,
                       gen.tokens_per_s, gen.seconds, samples)
