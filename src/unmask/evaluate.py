"""Held-out evaluation on the task suite with any decoding settings. `run_task` is the one
evaluation loop: `unmask eval`, training-time checks and `unmask bench` all run it."""

from collections.abc import Callable
from dataclasses import dataclass, field

from unmask.llm import LLM, BatchOutput
from unmask.params import GenerationParams
from unmask.errors import UnmaskError
from unmask.tasks import TASKS, score, split_examples


@dataclass
class TaskRun:
    """Everything one task's held-out examples produced under one setting."""

    task: str
    flags: list[bool] = field(default_factory=list)  # exact match (validity) of each example, in order
    token_accuracy: list[float] = field(default_factory=list)  # per example
    outputs: list[BatchOutput] = field(default_factory=list)  # one per batch, with its step trace
    samples: list[dict] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.flags)

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.outputs)

    @property
    def tokens(self) -> int:
        return sum(o.tokens for o in self.outputs)

    @property
    def row_forwards(self) -> int:
        """Forwards summed over examples (a batched forward counts for every row in it)."""
        return sum(r.nfe for o in self.outputs for r in o.results)


def examples_of(task: str, n: int, split: str = "selection"):
    """The first `n` examples of `split` (unmask.tasks.SPLITS), or an UnmaskError naming the problem."""
    try:
        return split_examples(task, split, n)
    except ValueError as e:
        raise UnmaskError(str(e)) from None


def run_task(llm: LLM, task: str, n: int, params: GenerationParams, batch_size: int, keep_samples: int = 0,
             progress: Callable[[int], None] | None = None, split: str = "selection") -> TaskRun:
    """Decode the first `n` examples of `task`'s held-out `split`, `batch_size` at a time, and score
    them. `progress(k)` is called after each batch of k examples."""
    run = TaskRun(task)
    examples = examples_of(task, n, split)
    run.outputs = llm.generate_batches([ex.prompt for ex in examples], params, batch_size, chat=False,
                                       progress=progress)
    for ex, r in zip(examples, (r for out in run.outputs for r in out.results)):
        s = score(ex, r.text)
        run.flags.append(s.exact)
        run.token_accuracy.append(s.token_accuracy)
        if len(run.samples) < keep_samples:
            run.samples.append({"prompt": ex.prompt, "gold": ex.answer, "output": r.text, "exact": s.exact})
    return run


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

    @classmethod
    def from_run(cls, run: TaskRun) -> "TaskResult":
        n = run.n
        return cls(run.task, n, sum(run.flags) / n, sum(run.token_accuracy) / n, run.row_forwards / n,
                   run.tokens / max(run.row_forwards, 1), run.seconds, run.samples, run.flags)

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("samples", "flags")}


def evaluate(
    llm: LLM,
    tasks: list[str] | tuple[str, ...] = TASKS,
    n: int = 200,
    params: GenerationParams | None = None,
    batch_size: int = 32,
    keep_samples: int = 0,
    progress: Callable[[int], None] | None = None,
    split: str = "selection",
) -> list[TaskResult]:
    params = (params or GenerationParams()).check(llm.arch.block_size)
    for t in tasks:
        examples_of(t, n, split)  # a bad split or size is named before anything decodes
    return [TaskResult.from_run(run_task(llm, t, n, params, batch_size, keep_samples, progress, split))
            for t in tasks]


def format_table(results: list[TaskResult]) -> str:
    lines = [f"{'task':8} {'n':>5} {'exact':>7} {'tok_acc':>8} {'nfe':>6} {'tok/fwd':>8} {'sec':>7}"]
    for r in results:
        lines.append(f"{r.task:8} {r.n:5d} {100 * r.exact:6.1f}% {100 * r.token_accuracy:7.1f}% "
                     f"{r.nfe:6.1f} {r.tokens_per_forward:8.2f} {r.seconds:7.1f}")
    return "\n".join(lines)
