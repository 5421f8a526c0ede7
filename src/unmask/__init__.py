"""unmask: fast, honest inference for masked diffusion language models."""

import os

# Must precede the first torch import: with shared cores, spinning OpenMP threads make a step
# ten times slower (see docs). Every entry point imports this package first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask.errors import CheckpointError, UnmaskError  # noqa: E402
from unmask.llm import LLM, BatchOutput, GenerationResult  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402

__all__ = ["LLM", "BatchOutput", "GenerationResult", "GenerationParams", "UnmaskError", "CheckpointError"]
__version__ = "0.1.0"
