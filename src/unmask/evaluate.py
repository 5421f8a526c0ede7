"""Held-out evaluation on the task suite with any decoding settings."""

from dataclasses import dataclass, field

from unmask.llm import LLM
from unmask.params import GenerationParams
from unmask.tasks import TASKS, score, held_out


@dataclass
class TaskResult:
    task: str
    n: int
    exact: float  # exact match (validity for tasks with several answers)
    token_accuracy: float
    nfe: float  # mean forwards per example (a batched forward counts for every row in it)
    tokens_per_forward: float  # tokens up to and including end of text, per forward
    seconds: float
    samples: list[dict] = field(default_factory=list)
    flags: list[bool] = field(default_factory=list)  # exact match of each example, in order

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("samples", "flags")}


def evaluate(
    llm: LLM,
    tasks: list[str] | tuple[str, ...] = TASKS,
    n: int = 200,
    params: GenerationParams | None = None,
    batch_size: int = 32,
    keep_samples: int = 0,
) -> list[TaskResult]:
    params = (params or GenerationParams()).check()
    out = []
    for task in tasks:
        examples = held_out(task, n)
        exact = acc = nfe = toks = secs = 0.0
        samples, flags = [], []
        for i in range(0, n, batch_size):
            chunk = examples[i : i + batch_size]
            res = llm.generate([ex.prompt for ex in chunk], params, chat=False)
            secs += res.seconds
            for ex, r in zip(chunk, res.results):
                s = score(ex, r.text)
                exact += s.exact
                flags.append(s.exact)
                acc += s.token_accuracy
                nfe += r.nfe
                toks += len(r.token_ids) + (r.finish_reason == "stop")
                if len(samples) < keep_samples:
                    samples.append({"prompt": ex.prompt, "gold": ex.answer, "output": r.text, "exact": s.exact})
        out.append(TaskResult(task, n, exact / n, acc / n, nfe / n, toks / max(nfe, 1), secs, samples, flags))
    return out


def format_table(results: list[TaskResult]) -> str:
    lines = [f"{'task':8} {'n':>5} {'exact':>7} {'tok_acc':>8} {'nfe':>6} {'tok/fwd':>8} {'sec':>7}"]
    for r in results:
        lines.append(f"{r.task:8} {r.n:5d} {100 * r.exact:6.1f}% {100 * r.token_accuracy:7.1f}% "
                     f"{r.nfe:6.1f} {r.tokens_per_forward:8.2f} {r.seconds:7.1f}")
    return "\n".join(lines)
