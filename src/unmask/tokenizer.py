"""Tokenizer from a checkpoint folder without transformers or remote code.

`tokenizer.json` is loaded with the tokenizers library; a folder with only `vocab.json` +
`merges.txt` (Dream / Qwen2 layout) gets the equivalent byte-level BPE. The chat template comes
from `chat_template.jinja` or `tokenizer_config.json` and is rendered with jinja2 the way
transformers renders it. Special token ids are read from the files, never hard-coded.
"""

from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from unmask.errors import CheckpointError, UnmaskError
from unmask.models.base import TokenIds
from unmask.models.loader import read_json

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_MASK_STRINGS = ("<|mdm_mask|>", "<|mask|>", "|<MASK>|", "<|MASK|>", "[MASK]", "<mask>")
_END_OF_TURN_STRINGS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>")
# fill-in-the-middle markers as Qwen2.5-Coder and unmask's code models spell them, and as StarCoder does
_EXPAND = "<|expand|>"  # DreamOn's expand token (a mask that becomes two)
_FIM_STRINGS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


def _content(tok) -> str | None:
    value = tok.get("content") if isinstance(tok, dict) else tok
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"tokenizer_config.json: special token {tok!r} is not a string")
    return value


class Tokenizer:
    def __init__(self, tok: HFTokenizer, config: dict, chat_template: str | None) -> None:
        self.tok = tok
        self.config = config
        self.chat_template = chat_template
        # variables a model family's own pipeline renders its template with (dllm's A2D Qwen3:
        # enable_thinking false, the empty think block it was trained after)
        self.template_vars: dict = {}
        self._template = None
        self._longest: int | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        folder = Path(path)
        cfg_path = folder / "tokenizer_config.json"
        config = read_json(cfg_path) if cfg_path.exists() else {}
        if (folder / "tokenizer.json").exists():
            try:
                tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # the tokenizers library raises a bare Exception on bad files
                raise CheckpointError(f"{folder / 'tokenizer.json'} could not be read: {e}") from None
        elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            try:
                tok = _byte_level_bpe(folder, config)
            except CheckpointError:
                raise
            except Exception as e:  # the tokenizers library raises a bare Exception on bad files
                raise CheckpointError(f"{folder}: vocab.json / merges.txt / added tokens could not be read: {e}") from None
        else:
            raise CheckpointError(f"{folder}: no tokenizer.json (or vocab.json + merges.txt)")
        template = None
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(config.get("chat_template"), str):
            template = config["chat_template"]
        return cls(tok, config, template)

    @property
    def longest_token(self) -> int:
        """Characters in the longest vocabulary entry (at least 1): no token covers more text."""
        if self._longest is None:
            self._longest = max([len(t) for t in self.tok.get_vocab(with_added_tokens=True)] + [1])
        return self._longest

    def check_length(self, text: str, positions: int, where: str = "prompt") -> None:
        """Text longer than `positions` tokens of the longest vocabulary entry (4 characters at
        least) cannot fit the model and is refused before it is tokenised (a 10 MB prompt would
        otherwise take seconds to read and then fail anyway)."""
        limit = positions * max(self.longest_token, 4)
        if len(text) > limit:
            raise UnmaskError(f"{where} has {len(text)} characters; this model reads at most {positions} positions "
                              f"(at most {limit} characters of text)", param=where)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tok.token_to_id(text)

    def special(self, name: str) -> str | None:
        """A special token string from tokenizer_config.json, e.g. special('eos_token')."""
        return _content(self.config.get(name))

    def unknown_words(self, text: str) -> list[str]:
        """Pieces of `text` that this tokenizer can only read as its unknown token (word-level
        vocabularies have one; byte-level BPE, as LLaDA's and Dream's, represents any text)."""
        unk = getattr(self.tok.model, "unk_token", None)
        unk_id = self.tok.token_to_id(unk) if unk else None
        if unk_id is None:
            return []
        enc = self.tok.encode(text, add_special_tokens=False)
        words = (text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == unk_id)
        return [w for w in words if w != unk]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """The conversation rendered by the checkpoint's template (`tools`: the functions a
        request offers, for templates that describe them; None renders none, as transformers)."""
        if self.chat_template is None:
            raise CheckpointError("this tokenizer has no chat template")
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        specials = {n: self.special(n) or "" for n in names}
        try:
            if self._template is None:
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
                env.globals["raise_exception"] = _raise
                self._template = env.from_string(self.chat_template)
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                         **specials, **self.template_vars)
        except jinja2.exceptions.TemplateError as e:
            raise CheckpointError(f"the checkpoint's chat template failed: {e}") from None

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        """A user prompt as ids: rendered through the chat template (which writes its own BOS) or
        encoded plainly with the tokenizer's own special-token rules."""
        if chat:
            return self.encode(self.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
        return self.encode(text)


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _byte_level_bpe(folder: Path, config: dict) -> HFTokenizer:
    """Qwen2's tokenizer (vocab.json + merges.txt + added tokens from tokenizer_config.json)."""
    tok = HFTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = config.get("added_tokens_decoder") or {}
    for idx in sorted(added, key=int):
        spec = added[idx]
        tok.add_special_tokens([AddedToken(spec["content"], special=bool(spec.get("special", True)), normalized=False)])
        got = tok.token_to_id(spec["content"])
        if got != int(idx):
            raise CheckpointError(f"tokenizer_config.json: added token {spec['content']!r} got id {got}, expected {idx}")
    return tok


def _ids(value, name: str = "token id") -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointError(f"{name} {value!r} must be a non-negative integer or a list of them")
    return list(values)


def resolve_token_ids(config: dict, generation_config: dict, tok: Tokenizer, needs_mask: bool = True) -> TokenIds:
    """Mask, EOS, pad, BOS and stop ids from config.json (its text_config where the ids live
    there, as in DiffusionGemma's), generation_config.json and the tokenizer. `needs_mask`: False
    for a model that has no mask token (a renoising model); its mask id is then None."""
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], **config}
    mask = config.get("mask_token_id")
    if mask is not None:
        given = _ids(mask, "config.json: mask_token_id")
        if len(given) != 1:
            raise CheckpointError(f"config.json: mask_token_id {mask!r} must be one token id")
        mask = given[0]
    if mask is None:
        mask = next((tok.token_id(s) for s in _MASK_STRINGS if tok.token_id(s) is not None), None)
    if mask is None and needs_mask:
        raise CheckpointError("no mask token: config.json has no mask_token_id and the tokenizer has no mask token")
    eos_list = _ids(config.get("eos_token_id"), "config.json: eos_token_id") or _ids(tok.token_id(tok.special("eos_token")))
    if not eos_list:
        raise CheckpointError("no end-of-text token: config.json has no eos_token_id and tokenizer_config.json no eos_token")
    # the tokenizer's pad token first: it is what the references' eval scripts pass
    # (`tokenizer.pad_token_id`), and released configs disagree with it (Fast-dLLM v2's config.json
    # says pad_token_id 151645, its stop token; its tokenizer's pad is <|endoftext|> 151643)
    pad = next((ids for ids in (_ids(tok.token_id(tok.special("pad_token"))),
                                _ids(generation_config.get("pad_token_id"), "generation_config.json: pad_token_id"),
                                _ids(config.get("pad_token_id"), "config.json: pad_token_id"))
                if ids and ids[0] != mask), [])
    bos = _ids(config.get("bos_token_id"), "config.json: bos_token_id") or _ids(tok.token_id(tok.special("bos_token")))
    stop = set(eos_list) | set(_ids(generation_config.get("eos_token_id"), "generation_config.json: eos_token_id"))
    stop |= set(_ids(tok.token_id(tok.special("eos_token"))))
    stop |= {i for i in (tok.token_id(s) for s in _END_OF_TURN_STRINGS) if i is not None}
    stop.discard(mask)
    expand = _ids(config.get("expand_token_id"), "config.json: expand_token_id") or _ids(tok.token_id(_EXPAND))
    if len(expand) > 1 or set(expand) & ({mask} | stop):
        raise CheckpointError(f"config.json: expand_token_id {expand!r} must be one token id, not the mask or a stop")
    fim = next((ids for ids in ([tok.token_id(s) for s in names] for names in _FIM_STRINGS)
                if all(i is not None for i in ids)), None)
    return TokenIds(
        mask=None if mask is None else int(mask),
        eos=eos_list[0],
        pad=pad[0] if pad else None,
        bos=bos[0] if bos else None,
        stop=tuple(sorted(stop)),
        fim=None if fim is None else tuple(int(i) for i in fim),
        expand=expand[0] if expand else None,
    )
