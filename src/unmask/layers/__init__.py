"""Framework-free building blocks shared by the model families."""

from unmask.layers.attention import KVBuffer, attend
from unmask.layers.norm import RMSNorm
from unmask.layers.rope import RotaryEmbedding, apply_rotary

__all__ = ["KVBuffer", "attend", "RMSNorm", "RotaryEmbedding", "apply_rotary"]
