"""Structured output: constraints (spec.py), the tokenizer's bytes (vocab.py), and llguidance's
grammar state per request with the room to finish (grammar.py). The engine applies them to masked
rows in engine/constrained.py."""

from unmask.constrain.grammar import GrammarVocab, RowGrammar
from unmask.constrain.spec import KINDS, Constraint

__all__ = ["KINDS", "Constraint", "GrammarVocab", "RowGrammar"]
