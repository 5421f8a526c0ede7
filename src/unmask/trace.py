"""The one record of a batched forward and the one raw result of a batch: what the engine and
the reference loops report, and what `LLM.generate` turns into its results."""

from dataclasses import dataclass, field


@dataclass
class ForwardRecord:
    # "full" (no cache, a cache refresh, or a prefill) | "window" (a cached step) | "seal" (a
    # cached step in which `seal_rows` rows also write the final K/V of the block they just
    # finished: a block model's seal forward, fused with the next block's first step)
    kind: str
    rows: int
    positions: float  # positions computed per row (mean over the rows)
    committed: int  # tokens committed over all rows
    seconds: float = 0.0
    seal_rows: int = 0
    block: int = -1  # the reference loops' block index (-1: rows may be in different blocks)
    edits: int = 0  # committed tokens replaced by another token over all rows (editing policies)
    remasked: int = 0  # committed tokens masked again over all rows (remasking policies)

    @property
    def refresh(self) -> bool:
        return self.kind == "full"

    @property
    def cached(self) -> bool:
        return self.kind != "full"


@dataclass
class Decoded:
    """A batch decoded by a reference loop: per row, its generated region and its forwards."""

    rows: list[list[int]]  # per row: the ids after its prompt (MASK where never committed)
    row_nfe: list[int]  # forwards each row took part in
    row_commits: list[list[int]]  # tokens committed at each of those forwards
    steps: list[ForwardRecord] = field(default_factory=list)
    cache: str = "none"
    prompt_len: int = 0  # columns before the generation region (the longest prompt)
    row_edits: list[list[int]] | None = None  # tokens edited at each of those forwards (editing loops)

    @property
    def nfe(self) -> int:
        return len(self.steps)
