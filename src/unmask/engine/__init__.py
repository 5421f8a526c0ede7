"""The request-level engine (engine.py) and its parts: row state, scheduler, model runner,
commit and post-step bookkeeping. The reference loops live apart, in unmask.reference."""

from unmask.engine.engine import Engine, EngineConfig, Request, Status, StepOutput

__all__ = ["Engine", "EngineConfig", "Request", "Status", "StepOutput"]
