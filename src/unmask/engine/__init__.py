"""The request-level engine (engine.py) and its parts: the row kinds (kind.py: masked.py,
renoise.py, speculative.py), row state, scheduler, random draws, model runner, commit and
post-step bookkeeping. The reference loops live apart, in unmask.reference."""

from unmask.engine.engine import Engine, EngineConfig, EngineLike, Request, Status, StepOutput, takes_for
from unmask.engine.kind import ROW_KINDS

__all__ = ["ROW_KINDS", "Engine", "EngineConfig", "EngineLike", "Request", "Status", "StepOutput", "takes_for"]
