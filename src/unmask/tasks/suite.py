"""Synthetic task suite: seeded generators with exact scoring.

Tasks differ in how strongly the answer tokens depend on each other, which is what decides how
many tokens a diffusion model can commit per forward without losing accuracy:
- copy, reverse: each answer token depends on one prompt token (low dependency). The 3-8 items
  are distinct (drawn without replacement from 10 digits and 20 words), so every answer token is
  fixed by one prompt token that can be found by content;
- sort: each position depends on the whole multiset;
- add / sub: 3-digit operands and the 4-digit result all written least-significant digit first
  and zero-padded, so each result digit sits at a fixed distance from the two operand digits it
  combines (a model with relative positions needs no counting); carries chain neighbouring
  answer positions;
- pairs: the seeds' "full house / high card" example: the answer is one of two equally likely
  two-word phrases that share no word; a mixture such as "high house" is invalid;
- json: render a small record as JSON tokens (structured output);
- word: GSM8K-like templated word problems with reasoning and "#### answer".
All text is whitespace-separated words; numbers are written digit by digit.
"""

import random
from dataclasses import dataclass

DIGITS = [str(d) for d in range(10)]
WORDS = ["red", "blue", "green", "black", "white", "cat", "dog", "fox", "owl", "bee",
         "sun", "moon", "star", "tree", "rock", "sea", "sky", "ice", "fire", "wind"]
NAMES = ["ann", "bob", "tom", "eve", "joe", "sue", "max", "liz"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "tokyo"]
PAIRS = {  # category -> two phrases with no word in common
    "hand": ("full house", "high card"),
    "drink": ("green tea", "black coffee"),
    "weather": ("heavy rain", "clear sky"),
    "route": ("north road", "south bridge"),
}
OBJECTS = ["apples", "pens", "books", "coins", "cards", "eggs"]


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str
    # for tasks with several correct answers (pairs): every valid answer
    valid: tuple[str, ...] = ()


def _digits(n: int, width: int | None = None) -> list[str]:
    s = str(n) if width is None else str(n).zfill(width)
    return list(s)


def _items(rng: random.Random) -> list[str]:
    return rng.sample(DIGITS + WORDS, rng.randint(3, 8))


def copy_task(rng: random.Random) -> Example:
    items = _items(rng)
    return Example("copy", "copy : " + " ".join(items), " ".join(items))


def reverse_task(rng: random.Random) -> Example:
    items = _items(rng)
    return Example("reverse", "reverse : " + " ".join(items), " ".join(reversed(items)))


def sort_task(rng: random.Random) -> Example:
    nums = [rng.randint(0, 9) for _ in range(rng.randint(3, 8))]
    return Example("sort", "sort : " + " ".join(map(str, nums)), " ".join(map(str, sorted(nums))))


def arith_task(rng: random.Random) -> Example:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    if rng.random() < 0.5:
        op, r = "+", a + b
    else:
        a, b = max(a, b), min(a, b)
        op, r = "-", a - b
    prompt = " ".join(["add" if op == "+" else "sub", *_lsb(a, 3), op, *_lsb(b, 3), "="])
    return Example("arith", prompt, " ".join(_lsb(r, 4)))


def _lsb(n: int, width: int) -> list[str]:
    """Digits of n, least significant first, zero-padded to `width`."""
    return list(reversed(_digits(n, width)))


def pairs_task(rng: random.Random) -> Example:
    cat = rng.choice(sorted(PAIRS))
    noise = [rng.choice(WORDS) for _ in range(3)]
    options = PAIRS[cat]
    return Example("pairs", f"pick {cat} " + " ".join(noise) + " :", rng.choice(options), options)


def json_task(rng: random.Random) -> Example:
    keys = rng.sample(["name", "age", "city", "color", "pet", "score"], 3)
    values = {
        "name": lambda: [rng.choice(NAMES)],
        "age": lambda: _digits(rng.randint(10, 99)),
        "city": lambda: [rng.choice(CITIES)],
        "color": lambda: [rng.choice(WORDS[:5])],
        "pet": lambda: [rng.choice(WORDS[5:10])],
        "score": lambda: _digits(rng.randint(0, 99)),
    }
    record = {k: values[k]() for k in keys}
    prompt = "json : " + " ".join(f"{k} {' '.join(v)}" for k, v in record.items())
    parts = []
    for k, v in record.items():
        val = " ".join(v) if v[0].isdigit() else f'"{v[0]}"'
        parts.append(f'"{k}" : {val}')
    return Example("json", prompt, "{ " + " , ".join(parts) + " }")


def word_task(rng: random.Random) -> Example:
    name = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    kind = rng.randrange(4)
    if kind == 0:
        q = f"{name} has {_n(a)} {obj} . {name} buys {_n(b)} more . how many {obj} now ?"
        steps, r = [f"{_n(a)} + {_n(b)} = {_n(a + b)}"], a + b
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{name} has {_n(a)} {obj} . {name} gives away {_n(b)} . how many {obj} now ?"
        steps, r = [f"{_n(a)} - {_n(b)} = {_n(a - b)}"], a - b
    elif kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q = f"{name} has {_n(a)} bags with {_n(b)} {obj} each . how many {obj} ?"
        steps, r = [f"{_n(a)} * {_n(b)} = {_n(a * b)}"], a * b
    else:
        c = rng.randint(1, a + b)
        q = f"{name} has {_n(a)} {obj} . {name} buys {_n(b)} more and gives away {_n(c)} . how many {obj} now ?"
        steps, r = [f"{_n(a)} + {_n(b)} = {_n(a + b)}", f"{_n(a + b)} - {_n(c)} = {_n(a + b - c)}"], a + b - c
    return Example("word", "question : " + q, " ; ".join(steps) + f" #### {_n(r)}")


def _n(x: int) -> str:
    return " ".join(_digits(x))


GENERATORS = {
    "copy": copy_task,
    "reverse": reverse_task,
    "sort": sort_task,
    "arith": arith_task,
    "pairs": pairs_task,
    "json": json_task,
    "word": word_task,
}

SPECIAL_WORDS = [":", "=", "+", "-", "*", ";", ".", "?", "####", "{", "}", ",",
                 "copy", "reverse", "sort", "add", "sub", "pick", "json", "question",
                 "has", "buys", "more", "gives", "away", "how", "many", "now", "bags", "with", "each", "and"]


def vocabulary() -> list[str]:
    """Every word any task can produce, in a fixed order."""
    words = list(DIGITS) + WORDS + NAMES + CITIES + OBJECTS + SPECIAL_WORDS
    words += sorted(PAIRS) + sorted({w for phrases in PAIRS.values() for p in phrases for w in p.split()})
    keys = ["name", "age", "city", "color", "pet", "score"]
    words += keys + [f'"{k}"' for k in keys]
    words += [f'"{v}"' for v in NAMES + CITIES + WORDS[:10]]
    out, seen = [], set()
    for w in words:
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out
