"""Each token's bytes, as the grammar engine must see them: the text the tokenizer's decoder
writes for it. Three vocabularies are read:

- byte-level BPE (LLaDA, Dream, Qwen2, LLaDA2, unmask's code models): a token's string spells
  bytes through GPT-2's byte-to-unicode table;
- SentencePiece-style pieces with byte fallback (Gemma): "\u2581" is a space, "<0xAB>" one byte;
- word-level vocabularies split on whitespace (the embedded models): the decoder joins words with
  one space, so each token is " word" and the text the grammar reads starts with one space that the
  decoded output does not have (`space_joined`; the constraint is compiled to expect it).

Special tokens (added tokens marked special) get no text: the grammar never writes them, except
the end-of-text tokens, which end the output where the grammar accepts."""

import json
from dataclasses import dataclass
from functools import lru_cache

from unmask.errors import UnmaskError


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's table: the printable character each byte is written as in a byte-level vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class VocabBytes:
    tokens: list[bytes]  # id -> bytes (b"" for special tokens)
    special: frozenset[int]  # ids that are never text
    space_joined: bool  # word-level: every token is " word" (the grammar reads one leading space)
    kind: str  # "byte-level", "sentencepiece" or "word-level"


def _types(node) -> set[str]:
    """Every component type in a tokenizer.json pre-tokenizer / decoder tree."""
    if not isinstance(node, dict):
        return set()
    out = {node.get("type")} if node.get("type") else set()
    for key in ("pretokenizers", "decoders", "normalizers"):
        for child in node.get(key) or []:
            out |= _types(child)
    return out


def vocab_bytes(hf_tokenizer) -> VocabBytes:
    """The bytes of every token of a `tokenizers.Tokenizer` (unmask.tokenizer.Tokenizer.tok)."""
    spec = json.loads(hf_tokenizer.to_str())
    model = spec.get("model") or {}
    decoder, pre = _types(spec.get("decoder")), _types(spec.get("pre_tokenizer"))
    vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1 if vocab else 0
    special = frozenset(int(t["id"]) for t in spec.get("added_tokens") or [] if t.get("special"))
    strings = [""] * n
    for s, i in vocab.items():
        strings[i] = s
    tokens: list[bytes] = []
    if "ByteLevel" in decoder or "ByteLevel" in pre:
        table, kind = _byte_decoder(), "byte-level"
        for i, s in enumerate(strings):
            if i in special:
                tokens.append(b"")
            elif all(c in table for c in s):
                tokens.append(bytes(table[c] for c in s))
            else:  # an added, non-special token is written as it is
                tokens.append(s.encode("utf-8"))
    elif "Metaspace" in decoder or "ByteFallback" in decoder or "Metaspace" in pre:
        kind = "sentencepiece"
        for i, s in enumerate(strings):
            if i in special:
                tokens.append(b"")
            elif len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                tokens.append(bytes([int(s[3:5], 16)]))
            else:
                tokens.append(s.replace("\u2581", " ").encode("utf-8"))
        if any(t.get("prepend_scheme", "always") != "never" and t.get("type") == "Metaspace"
               for t in [spec.get("decoder") or {}, spec.get("pre_tokenizer") or {}]):
            # the decoder strips the first piece's leading space: not a concatenation of the pieces
            raise UnmaskError("structured output: this SentencePiece tokenizer strips a leading space when "
                              "decoding, so its text is not its tokens' bytes joined; not supported yet")
    elif model.get("type") == "WordLevel" and pre <= {"WhitespaceSplit", "Whitespace"} and not decoder:
        kind = "word-level"
        unk = vocab.get(model.get("unk_token") or "")
        special = special | ({unk} if unk is not None else set())
        for i, s in enumerate(strings):
            tokens.append(b"" if i in special else b" " + s.encode("utf-8"))
    else:
        raise UnmaskError(f"structured output: tokenizer with model {model.get('type')!r}, pre-tokenizer "
                          f"{sorted(pre)} and decoder {sorted(decoder)} is not one unmask can read token "
                          "bytes from (byte-level BPE, SentencePiece with byte fallback, word-level)")
    return VocabBytes(tokens, special, kind == "word-level", kind)
