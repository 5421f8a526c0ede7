"""A generation parameter as the component that reads it declares it.

Each component declares the fields it reads where it is defined — a commit policy its threshold,
a cache its refresh triggers, the proposal its sampling settings, a compat mode its reference's
own settings — as `Knob`s: default, type, help text, range check, and whether a checkpoint's
generation_config.json may set it. `unmask.params` assembles them into the one flat record
(`GenerationParams`), from which the CLI flags, the server's extra fields, the lm-eval model
arguments and the setting key are generated. This module imports nothing of unmask.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    default: object
    type: type  # int, float, str or bool; the field may also be None when its default is None
    help: str
    check: Callable[[str, object], str | None] | None = None  # (name, value) -> None or the message
    from_model: bool = False  # a checkpoint's generation_config.json may set it


# A check takes (name, value) and returns None or the whole message, naming both.
def positive_int(name: str, v) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    return None if ok else f"{name} {v!r} must be a positive integer"


def non_negative_int(name: str, v) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return None if ok else f"{name} {v!r} must be a non-negative integer"


def interval(lo: float, hi: float, lo_open: bool = True, hi_open: bool = False):
    def check(name: str, v) -> str | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        return None if ok else f"{name} {v!r} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return check


POSITIVE = interval(0, math.inf, hi_open=True)  # (0, inf)
NON_NEGATIVE = interval(0, math.inf, lo_open=False, hi_open=True)  # [0, inf)
UNIT = interval(0, 1)  # (0, 1]


def choices(names):
    """One of `names` (a tuple, or a registry: its current keys are read at each check)."""
    def check(name: str, v) -> str | None:
        return None if v in names else f"unknown {name} {v!r}; choose one of {', '.join(names)}"
    check.choices = names
    return check


def merge(into: dict, declared: dict, owner: str) -> dict:
    """Add `declared` (name -> Knob) to `into`; a name two components declare must be one Knob
    (shared by reference, as the caches that read refresh_interval share it)."""
    for name, knob in declared.items():
        if into.get(name, knob) is not knob:
            raise TypeError(f"generation parameter {name!r} is declared twice ({owner} and another component)")
        into[name] = knob
    return into
