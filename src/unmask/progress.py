"""A one-line progress bar on stderr, drawn only when stderr is a terminal (or when forced)."""

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", enabled: bool | None = None, unit: str = "it",
                 start: int = 0) -> None:
        """`start`: units already done before this run (a resumed job); the rate counts new ones."""
        self.total, self.label, self.unit = max(total, 1), label, unit
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.done = self.start = start
        self.t0 = time.perf_counter()

    def update(self, n: int = 1, extra: str = "") -> None:
        self.done += n
        if not self.enabled:
            return
        width = 30
        filled = int(width * min(self.done, self.total) / self.total)
        elapsed = time.perf_counter() - self.t0
        rate = (self.done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        sys.stderr.write(f"\r{self.label}[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{rate:.2f} {self.unit}/s eta {eta / 60:.1f} min {extra}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
