"""Row kinds: what a running request's row is and how it steps. The engine (engine.py) owns the
requests, admission, the token budget, the trace and the outputs; a row kind owns its rows'
tensors and forwards. The kinds unmask ships: "masked" (masked diffusion: full-attention, block
and causal models, engine/masked.py), "renoise" (canvases of random tokens rewritten until they
stop, engine/renoise.py) and "speculative" (a drafter proposes, an autoregressive target
verifies, engine/speculative.py). A new kind is one class in one file plus `@ROW_KINDS.register`:
the model it decodes picks it (`suits`, asked by `kind_for`), and what its requests may carry,
which parameters its rows run and what they hold at unwritten positions are its own to say
(`takes`, `screen` / `accept`, `mask_token`), which every front end asks.

One engine step asks the kind, in this order:
1. `admit(reqs)`: the requests that join now become rows (appended at the end);
2. `cost()`: what each row would compute this step, from which the engine's token budget picks
   the rows that run (oldest first; `late` rows after the others);
3. `decode(run)`: the forwards and commits of the rows `run` ((n,) bool, or None: every row runs,
   which the budget says without a tensor only when `cost` gave its `total`), reported as a `Report`;
4. `remove(rows)`: finished rows (the engine found them in the report) or an aborted request's
   row leave; the kind's rows move as engine/rows.py `Rows.remove` moves them.
The kind never builds a StepOutput or touches a Request's record: the engine does, from the
report, for every kind alike."""

from dataclasses import dataclass, field, fields
from typing import ClassVar, Protocol

import torch

from unmask.compat import COMPAT_MODES, get_mode
from unmask.errors import UnmaskError
from unmask.registry import Registry
from unmask.trace import ForwardRecord

ROW_KINDS = Registry("row kind")


@dataclass
class Stats:
    """A kind's own counters of a request (Request.stats) and of one step (StepOutput.stats):
    each kind subclasses it with its integer fields; the engine adds a step's to the request's."""

    def add(self, other: "Stats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Cost:
    """(n,) positions each row computes if it runs this step, (n,) the rows' admission order
    (Rows.seq: rows are in no particular order), and (n,) bool: rows that queue behind the others
    (a masked row's full forward, O(canvas), after the cached windows). `total`: the summed
    positions as a host int, when the kind already read it (a masked kind reads its next step's
    plan with the step's report); a total within the budget lets every row run without a look."""

    positions: torch.Tensor
    seq: torch.Tensor
    late: torch.Tensor | None = None
    total: int | None = None


@dataclass
class Report:
    """What one step did, for the rows that ran (host values, read in the kind's few transfers).
    Parallel lists, one entry per row in `rows` (row indices at the start of the step)."""

    rows: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)  # the row's committed answer length after the step
    new_ids: list[list[int]] = field(default_factory=list)  # ids that extended it this step
    forwards: list[int] = field(default_factory=list)  # forwards of the model the row took part in
    commits: list[list[int]] = field(default_factory=list)  # tokens it committed at each of them
    done: list[bool] = field(default_factory=list)
    stats: list[Stats] = field(default_factory=list)
    # finished rows: the whole generated region (up to gen_length; MASK where never committed)
    answers: dict[int, list[int]] = field(default_factory=dict)
    # watched rows (the playground): the canvas to show, for a renoising row each position's state,
    # for a masked row what each open position would become this step (answer position -> token)
    views: dict[int, tuple[list[int], list[str] | None, dict[int, int] | None]] = field(default_factory=dict)
    records: list[ForwardRecord] = field(default_factory=list)
    # rows whose request asked for logprobs: one (logprob, [(id, logprob)] of the most likely) per new id
    logprobs: dict[int, list] = field(default_factory=dict)

    def row(self, i: int, committed: int, new_ids: list[int], forwards: int, commits: list[int], done: bool,
            stats: Stats) -> None:
        self.rows.append(i)
        self.committed.append(committed)
        self.new_ids.append(new_ids)
        self.forwards.append(forwards)
        self.commits.append(commits)
        self.done.append(done)
        self.stats.append(stats)


@dataclass(frozen=True)
class Takes:
    """A row kind's request contract on one model (`RowKind.takes(arch, tokens)`): for each input
    a request may carry, None where the kind takes it, else the refusal, naming why. Front ends
    ask it (unmask.inputs, the LLM, the server) and never check the model's kind themselves."""

    label: str = "masked"  # what its rows decode as, for people: masked, autoregressive, renoising
    suffix: str | None = None  # text after the hole (infilling)
    template: str | None = None  # a region of several holes with fixed text between them
    constraint: str | None = None  # structured output
    sampled_constraint: str | None = None  # structured output at a temperature above 0
    logprobs: str | None = None  # each token's log-probability
    # its rows' parameters: unmask's fast defaults apply (masked diffusion rows), or not (an
    # autoregressive or renoising model decodes as its own sampler does); `sampler`: the reference
    # mode whose settings its rows take, from the checkpoint (a renoising model's own sampler)
    fast: bool = True
    sampler: str | None = None
    # text after a hole is read laid out prefix-suffix-middle with the tokenizer's fill-in-the-middle
    # markers (unmask.inputs.layout: an autoregressive model), not in place on the canvas
    psm: bool = False
    diagnose: str | None = None  # `unmask diagnose` (a commit-time look at an approximate cache)
    # what a summary names as the decoding, where its rows follow no commit policy of their own
    # ("autoregressive", "speculative"); None: the request's policy
    decodes: str | None = None

    def need(self, what: str, param: str | None = None) -> None:
        """Raise the kind's refusal of input `what` (an UnmaskError naming `param`), if it has one."""
        reason = getattr(self, what)
        if reason is not None:
            raise UnmaskError(reason, param=param)


def suffix_refusal(arch, why: str) -> str:
    """A kind's refusal of text after a hole on a model of `arch`, `why` in the kind's words."""
    return (f"a suffix (text after the hole) needs a full-attention masked diffusion model; this {arch.family} "
            f"model cannot see it: {why}")


def template_refusal(arch, why: str) -> str:
    """A kind's refusal of a template of several holes on a model of `arch`, `why` in its words."""
    return f"several holes need a full-attention masked diffusion model; this {arch.family} model {why}"


class RowKind(Protocol):
    """The protocol the engine steps a kind through (see the module docstring)."""

    name: ClassVar[str]
    Stats: ClassVar[type[Stats]]  # the kind's per-request counters
    diagnoses: ClassVar[bool]  # does it feed a commit-time observer (engine/diagnostics.py)?
    observer: object  # that observer, or None
    rows: object  # its Rows (engine/rows.py): `reqs` (the running requests, row by row), `n`, `seq`
    prefix: object  # its prompt-prefix cache across requests (kv/prefix.py PrefixStore), or None

    @classmethod
    def suits(cls, arch, drafter) -> bool:
        """Whether its rows decode a model of `arch` (with `drafter`, a DFlash drafter, or None):
        `kind_for` picks the one registered kind that says so."""

    @classmethod
    def takes(cls, arch, tokens) -> Takes:
        """The kind's request contract on a model of `arch` with `tokens` (see Takes)."""

    @classmethod
    def accept(cls, params, arch, given: frozenset | None, engine: bool) -> object:
        """`params` (GenerationParams) as its rows on a model of `arch` run them, checked, or an
        UnmaskError naming what they cannot take (engine/accept.py; `given`: the fields the
        caller set, None: those that differ from the reference setting)."""

    @classmethod
    def mask_token(cls, arch) -> str | None:
        """What its rows on a model of `arch` hold at positions not yet written: "model" (the
        checkpoint's mask token: a checkpoint without one is refused), "placeholder" (any id the
        model never writes: the drafter's mask token, else a spare id of the embedding) or None
        (no such positions)."""

    @classmethod
    def screen(cls, given: dict, arch) -> dict:
        """The fields a caller gave (None: not given), before the model's defaults fill them in:
        refused by name where the kind knows already that its rows cannot use them, and completed
        where its sampler fixes a field; what it returns is resolved (unmask.params) and accepted."""

    def prepare(self, params) -> object:
        """What a request's rows will decode with, built once when it is added (Request.parts)."""

    def admit(self, reqs: list) -> None: ...

    def cost(self) -> Cost: ...

    def decode(self, run: torch.Tensor | None) -> Report: ...

    def remove(self, rows: list[int]) -> None: ...


def check_compat_family(given: dict, arch) -> dict:
    """A named reference mode's family, checked before its settings (a default may not fit it)."""
    if isinstance(given.get("compat"), str) and given["compat"] in COMPAT_MODES:
        get_mode(given["compat"]).check_family(arch.family)
    return given


@dataclass
class KindContext:
    """What a row kind is built from: the model, its token ids, the device, the engine's random
    draws (engine/draws.py), the drafter of a speculative engine (else None), and the bytes its
    prefix cache may hold (kv/prefix.py; 0: none)."""

    model: object
    tokens: object
    device: torch.device
    draws: object
    drafter: object = None
    prefix_bytes: int = 0


def kind_for(arch, drafter=None) -> str:
    """The row kind a model decodes with: the one registered kind whose `suits` says so (a
    masked, renoising or speculative model's, or a kind a new architecture selects)."""
    names = [name for name, kind in ROW_KINDS.items() if kind.suits(arch, drafter)]
    if len(names) == 1:
        return names[0]
    who = f"several row kinds ({', '.join(names)}) decode" if names else "no row kind decodes"
    what = f"a {arch.kind} {arch.family} model" + (" with a drafter" if drafter is not None else "")
    raise UnmaskError(f"{who} {what}; the row kinds: {', '.join(ROW_KINDS)}")
