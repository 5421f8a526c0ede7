"""The decode loop and its per-batch state."""

from unmask.engine.loop import Decoded, StepRecord, decode

__all__ = ["Decoded", "StepRecord", "decode"]
