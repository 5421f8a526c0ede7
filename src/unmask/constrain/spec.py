"""What a user asks the output to be: a JSON schema (or any JSON object), a regular expression,
one of a list of strings, or a Lark grammar (llguidance's dialect; GBNF is converted). One
`Constraint` per request; `grammar()` is the llguidance grammar it compiles to (checked against a
vocabulary in constrain/grammar.py)."""

import json
from dataclasses import dataclass

from unmask.errors import UnmaskError

KINDS = ("json", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS
    value: str  # the JSON schema as JSON text, the regex, the choices as a JSON list, the grammar

    @classmethod
    def json_schema(cls, schema) -> "Constraint":
        """A JSON schema (dict or JSON text); `{}` or `{"type": "object"}` for any object."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise UnmaskError(f"json schema is not JSON: {e}", param="json_schema") from None
        if not isinstance(schema, (dict, bool)):
            raise UnmaskError(f"json schema {schema!r} must be a JSON object", param="json_schema")
        return cls("json", json.dumps(schema))  # key order kept: llguidance writes properties in schema order

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        if not isinstance(pattern, str) or not pattern:
            raise UnmaskError(f"regex {pattern!r} must be a non-empty string", param="regex")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options) -> "Constraint":
        if isinstance(options, str) or not isinstance(options, (list, tuple)) or not options:
            raise UnmaskError(f"choice {options!r} must be a non-empty list of strings", param="choice")
        for o in options:
            if not isinstance(o, str) or not o:
                raise UnmaskError(f"choice option {o!r} must be a non-empty string", param="choice")
        return cls("choice", json.dumps(list(dict.fromkeys(options))))

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        if not isinstance(text, str) or not text.strip():
            raise UnmaskError(f"grammar {text!r} must be a non-empty Lark (or GBNF) grammar", param="grammar")
        return cls("grammar", text)

    @classmethod
    def of(cls, kind: str, value) -> "Constraint":
        """Build one from its kind's name (the CLI's and the server's fields)."""
        makers = {"json": cls.json_schema, "regex": cls.regex, "choice": cls.choice, "grammar": cls.grammar}
        if kind not in makers:
            raise UnmaskError(f"constraint kind {kind!r} must be one of {', '.join(KINDS)}", param="structured_outputs")
        return makers[kind](value)

    def describe(self) -> str:
        short = self.value if len(self.value) <= 60 else self.value[:57] + "..."
        return f"{self.kind} {short}"

    def sub_grammar(self, json_options: dict) -> dict:
        """The llguidance grammar entry (one of TopLevelGrammar's `grammars`) for this constraint."""
        if self.kind == "json":
            schema = json.loads(self.value)
            if isinstance(schema, dict):
                schema = {**schema, "x-guidance": {**json_options, **schema.get("x-guidance", {})}}
            return {"json_schema": schema}
        if self.kind == "regex":
            return {"lark_grammar": "start: " + _lark_regex(self.value)}
        if self.kind == "choice":
            return {"lark_grammar": "start: " + " | ".join(json.dumps(o) for o in json.loads(self.value))}
        text = self.value
        if "::=" in text:  # GBNF (llama.cpp's, xgrammar's): llguidance converts it
            from llguidance.gbnf_to_lark import gbnf_to_lark  # the module, not the package attribute

            try:
                text = gbnf_to_lark(text)
            except Exception as e:  # the converter raises plain exceptions on bad input
                raise UnmaskError(f"grammar: GBNF could not be read: {e}", param="grammar") from None
        return {"lark_grammar": text}

    def matches(self, text: str) -> bool:
        """Does `text` (decoded output) belong to the language? A check for tests and measurements
        that does not use the grammar engine: jsonschema for schemas, Python's re for regexes."""
        import re

        if self.kind == "json":
            import jsonschema

            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return False
            return jsonschema.Draft202012Validator(json.loads(self.value)).is_valid(value)
        if self.kind == "regex":
            return re.fullmatch(self.value, text) is not None
        if self.kind == "choice":
            return text in json.loads(self.value)
        raise UnmaskError("a grammar constraint has no independent check; parse the text with the grammar")


def _lark_regex(pattern: str) -> str:
    """A regex as a Lark terminal: /.../ with its unescaped slashes escaped."""
    out, escaped = [], False
    for c in pattern:
        out.append("\\/" if c == "/" and not escaped else c)
        escaped = c == "\\" and not escaped
    return "/" + "".join(out) + "/"
