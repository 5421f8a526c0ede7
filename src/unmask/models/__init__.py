"""Model families (logits only), their registry and the strict checkpoint loader."""

from unmask.models.base import ArchConfig, DiffusionLM, TokenIds
from unmask.models.qwen import QwenModel
from unmask.models.llada import LLaDAModel
from unmask.models.loader import load_model
from unmask.models.registry import FAMILIES, resolve_family

__all__ = ["ArchConfig", "DiffusionLM", "TokenIds", "QwenModel", "LLaDAModel", "load_model", "FAMILIES", "resolve_family"]
