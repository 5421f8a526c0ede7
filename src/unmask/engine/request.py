"""A request's record in the engine, what a step reports for it, and the engine's settings."""

from dataclasses import dataclass, field
from enum import Enum

from unmask.engine.kind import Stats
from unmask.errors import UnmaskError
from unmask.params import GenerationParams


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64  # requests decoded together
    max_num_batched_tokens: int = 16384  # positions computed per step, over all rows
    max_waiting: int = 4096  # queued requests beyond which add_request refuses
    # "continuous": a request joins at the next step. "static" (the baseline that the load
    # benchmark compares with): a batch is admitted only when the running one has drained, once
    # max_num_seqs requests wait or the oldest has waited static_wait seconds
    scheduling: str = "continuous"
    static_wait: float = 0.05
    # forward records kept in Engine.trace (a ring: the newest); None keeps every one (offline batches)
    trace_limit: int | None = 4096
    # prompt K/V shared across requests (kv/prefix.py), for the kinds whose prompt K/V depend on
    # nothing after them: the most memory its pages may take, MiB (0: off)
    prefix_cache_mb: float = 256

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UnmaskError(f"{name} {v!r} must be a positive integer")
        if self.scheduling not in ("continuous", "static"):
            raise UnmaskError(f"scheduling {self.scheduling!r} must be continuous or static")
        if not (isinstance(self.static_wait, (int, float)) and 0 <= self.static_wait < 3600):
            raise UnmaskError(f"static_wait {self.static_wait!r} must be seconds in [0, 3600)")
        mb = self.prefix_cache_mb
        if not isinstance(mb, (int, float)) or isinstance(mb, bool) or not 0 <= mb < 2**30:
            raise UnmaskError(f"prefix_cache_mb {mb!r} must be a non-negative number of MiB (0: off)")
        t = self.trace_limit
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise UnmaskError(f"trace_limit {t!r} must be a positive integer or None")


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class Request:
    id: str
    prompt: list[int]
    params: GenerationParams
    parts: object  # what its row kind prepared from the parameters (masked rows: engine/parts.py), or None
    arrival: float
    status: Status = Status.WAITING
    nfe: int = 0  # forwards of the model it took part in
    commits: list[int] = field(default_factory=list)  # tokens committed at each of its forwards
    stats: Stats | None = None  # its row kind's own counters (edits, seal forwards, drafted tokens...)
    committed: int = 0  # contiguous committed tokens from the start of the answer
    canvas: list[int] | None = None  # the generated region when finished (MASK where never committed)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    started: float | None = None  # first forward
    first_commit: float | None = None  # first step that grew the committed prefix
    finished: float | None = None
    watch: bool = False  # report the whole canvas and this step's proposals (the playground)
    suffix: list[int] = field(default_factory=list)  # fixed text after the hole (infilling; full-attention models)
    # the generated region's starting tokens when it holds fixed text between holes (a template
    # with several holes, unmask.holes): the mask id at each hole position; None: all masks
    fill: list[int] | None = None
    # structured output: the request's grammar state (unmask.constrain RowGrammar), or None
    grammar: object = None
    # logprobs (engine/logprobs.py): None, or how many most likely tokens to report beside each chosen one
    logprobs: int | None = None
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache (kv/prefix.py)

    def counters(self) -> dict:
        """Its row kind's counters by name (empty before it was added), and its grammar's."""
        out = {} if self.stats is None else self.stats.as_dict()
        if self.grammar is not None:
            out.update(grammar_forced=self.grammar.forced, grammar_rejected=self.grammar.rejected)
        return out

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)


@dataclass
class StepOutput:
    """What one step changed for one request."""

    request: Request
    committed: int  # contiguous committed prefix after this step
    new_ids: list[int]  # the ids that extended the committed prefix in this step
    finished: bool
    canvas: list[int] | None = None  # watched requests: the answer region after this step (MASK = open)
    # watched rows of a renoising model: each canvas position's state, "committed" (a finished
    # canvas), or in the running canvas (whose argmax `canvas` shows) "stable" (argmax unchanged
    # this step), "accepted" (changed, and accepted by the sampler) or "renoised" (changed, renoised)
    states: list[str] | None = None
    # watched masked rows: what each open answer position would become this step (position -> token)
    proposal: dict[int, int] | None = None
    stats: Stats | None = None  # the row kind's counters of this step (e.g. speculative rows' drafted, accepted)
    forwards: int = 0  # forwards of the model the request took part in during this step
    tokens: int = 0  # tokens it committed in them
    # a request with logprobs: one (logprob, [(id, logprob)] of the most likely) per new id
    logprobs: list | None = None
