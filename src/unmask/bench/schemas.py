"""Random constraints for structured output's property tests and measurements: JSON schemas
(nested objects, arrays, enums, numbers, strings, required fields) and regular expressions, each
drawn from a seeded random.Random (the same seed gives the same constraint). The regexes use
ASCII classes and the constructs Python's re and llguidance's (Rust) regex read alike, so that
`Constraint.matches` (Python's re) checks what llguidance enforced."""

import random

NAMES = ["name", "age", "id", "tags", "city", "ok", "score", "items", "kind", "x", "y", "note"]
WORDS = ["red", "blue", "green", "cat", "dog", "a", "b", "yes", "no"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema: an object at the top, values nested at most two levels deeper."""
    if depth == 0:
        return _object(rng, depth)
    kinds = ["string", "integer", "number", "boolean", "enum", "null"] + (["array", "object"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "object":
        return _object(rng, depth)
    if kind == "array":
        out = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.4:
            out["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.4:
            out["maxItems"] = out.get("minItems", 0) + rng.randint(1, 3)
        return out
    if kind == "string":
        out = {"type": "string"}
        if rng.random() < 0.3:
            out["maxLength"] = rng.randint(1, 8)
        if rng.random() < 0.2:
            out["minLength"] = rng.randint(0, min(2, out.get("maxLength", 2)))
        return out
    if kind in ("integer", "number"):
        out = {"type": kind}
        if rng.random() < 0.4:
            out["minimum"] = rng.randint(-5, 5)
        if rng.random() < 0.4:
            out["maximum"] = out.get("minimum", 0) + rng.randint(0, 100)
        return out
    if kind == "enum":
        pool = WORDS + [0, 1, 42, True, None]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    return {"type": kind}


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(NAMES, rng.randint(1, 4 if depth < 2 else 2))
    props = {n: random_schema(rng, depth + 1) for n in names}
    out = {"type": "object", "properties": props, "required": [n for n in names if rng.random() < 0.6]}
    if rng.random() < 0.7:
        out["additionalProperties"] = False
    return out


_ATOMS = ["a", "b", "x", "0", "7", "-", "@", ".", " ", "[a-z]", "[0-9]", "[A-Z]", "[abc]", "[0-9a-f]", r"\.", r"\-"]


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A regular expression of literals, ASCII classes, groups, alternations and quantifiers."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.2 and depth < 2:
            alts = [random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3))]
            atom = "(" + "|".join(alts) + ")"
        else:
            atom = rng.choice(_ATOMS)
        q = rng.random()
        atom += "" if q < 0.55 else "?" if q < 0.65 else "*" if q < 0.75 else "+" if q < 0.85 else \
            "{%d,%d}" % (a := rng.randint(0, 2), a + rng.randint(0, 3))
        parts.append(atom)
    return "".join(parts)
