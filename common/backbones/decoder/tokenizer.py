"""A decoder's tokenizer: text <-> ids, its special ids, and its chat template, from a Hugging Face folder or
a GGUF file, and saved back as a Hugging Face folder.

The ids come from a `tokenizers.Tokenizer` (Hugging Face's Rust tokenizer: the same one transformers and vLLM
use, so an exported folder tokenises identically there). The chat template is the model's own jinja2 text,
rendered as transformers' `apply_chat_template` renders it (sandboxed, trim_blocks / lstrip_blocks,
`raise_exception`, `bos_token` / `eos_token`), so a prompt here is the prompt the model was tuned on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common.backbones.checkpoint import CheckpointError, read_json_object
from common.backbones.gguf.tokenizer import add_bos_default, build_tokenizer, special_ids


@dataclass
class DecoderTokenizer:
    """Text <-> token ids for one decoder, with its special ids and chat template."""

    tokenizer: Tokenizer
    """The byte-level BPE tokenizer (special tokens included)."""
    chat_template: str | None
    """The model's jinja2 chat template, None when it has none."""
    bos_id: int | None
    """Beginning-of-sequence id, None when the vocabulary has none."""
    eos_ids: tuple[int, ...]
    """Ids that end generation (eos first, then end-of-turn ids)."""
    pad_id: int | None
    """Padding id, None when unset."""
    add_bos: bool
    """Whether `encode` puts bos first."""
    where: str = ""
    """The file or folder it came from, named in errors."""
    _template: Any = field(default=None, init=False, repr=False, compare=False)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`; special tokens written in it ('<|im_start|>') are their single ids. With
        `add_bos`, bos goes first unless the text already starts with it (a chat template that writes
        `{{ bos_token }}` itself gives one bos, as transformers' apply_chat_template does)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids` (bytes joined back, so decode(encode(t)) == t); `skip_special` drops control
        tokens such as <|im_end|>."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token(self, token_id: int) -> str | None:
        """The vocabulary string of one id (None when out of range)."""
        return self.tokenizer.id_to_token(int(token_id))

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The prompt the model expects for one user turn (and an optional system turn), ending where the
        assistant's answer begins (add_generation_prompt=True)."""
        from jinja2.exceptions import TemplateError

        if self.chat_template is None:
            raise CheckpointError(
                f"{self.where}: the model has no chat template; give the prompt as plain text"
            )
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user}
        ]
        try:
            return self._compiled().render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self._text(self.bos_id),
                eos_token=self._text(self.eos_ids[0] if self.eos_ids else None),
            )
        except TemplateError as err:
            raise CheckpointError(f"{self.where}: the chat template failed: {err}") from None

    def _text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.token(token_id) or "")

    def _compiled(self):
        """The template compiled once, in transformers' sandboxed environment."""
        if self._template is None:
            self._template = _environment().from_string(self.chat_template)
        return self._template

    @classmethod
    def from_gguf(cls, metadata: dict, where: str) -> DecoderTokenizer:
        """The tokenizer of a GGUF file's metadata (`GgufCheckpoint.metadata`)."""
        add_bos = add_bos_default(metadata)
        bos, eos, pad = special_ids(metadata)
        return cls(
            tokenizer=build_tokenizer(metadata, add_bos, where),
            chat_template=metadata.get("tokenizer.chat_template"),
            bos_id=bos,
            eos_ids=eos,
            pad_id=pad,
            add_bos=add_bos and bos is not None,
            where=where,
        )

    @classmethod
    def from_folder(cls, folder) -> DecoderTokenizer:
        """The tokenizer of a Hugging Face folder: tokenizer.json, and from tokenizer_config.json (optional)
        the chat template, bos/eos/pad tokens and add_bos_token; generation_config.json's eos ids join."""
        folder = Path(folder)
        tokenizer = _read_tokenizer(folder)
        config = _read_json(folder / "tokenizer_config.json")
        ids = {key: _token_id(tokenizer, config.get(key), folder, key) for key in ("bos_token", "eos_token")}
        eos = [] if ids["eos_token"] is None else [ids["eos_token"]]
        extra = _read_json(folder / "generation_config.json").get("eos_token_id", [])
        eos += [int(i) for i in (extra if isinstance(extra, list) else [extra]) if int(i) not in eos]
        bos = ids["bos_token"]
        add_bos = config.get("add_bos_token")
        if add_bos is None:  # Llama 3 folders say it only through the post-processor
            add_bos = bos is not None and tokenizer.encode("a").ids[:1] == [bos]
        return cls(
            tokenizer=tokenizer,
            chat_template=_chat_template(folder, config),
            bos_id=bos,
            eos_ids=tuple(eos),
            pad_id=_token_id(tokenizer, config.get("pad_token"), folder, "pad_token"),
            add_bos=bool(add_bos) and bos is not None,
            where=str(folder),
        )

    def save(self, folder) -> None:
        """tokenizer.json and tokenizer_config.json (plus generation_config.json when several ids end
        generation) that `from_folder`, transformers and vLLM read back to the same behaviour."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(folder / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None if self.bos_id is None else self._text(self.bos_id),
            "eos_token": self._text(self.eos_ids[0]) if self.eos_ids else None,
            "pad_token": None if self.pad_id is None else self._text(self.pad_id),
            "add_bos_token": self.add_bos,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        if len(self.eos_ids) > 1:
            generation = {"bos_token_id": self.bos_id, "eos_token_id": list(self.eos_ids)}
            (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _raise(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _environment():
    """transformers' chat-template environment: sandboxed (a template cannot reach Python internals),
    whitespace control as transformers sets it, and the helpers templates call."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _read_tokenizer(folder: Path) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (a Hugging Face checkpoint folder is needed)")
    if not path.is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json (save the tokenizer with the model)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises plain Exception for a malformed file
        raise CheckpointError(f"{path}: not a readable tokenizer.json ({err})") from None


def _read_json(path: Path) -> dict:
    """A JSON object from an optional file ({} when it is absent)."""
    return read_json_object(path) if path.is_file() else {}


def _token_id(tokenizer: Tokenizer, token: Any, folder: Path, key: str) -> int | None:
    """The id of a tokenizer_config.json token entry (a string or {"content": ...}), None when unset."""
    if isinstance(token, dict):
        token = token.get("content")
    if token is None:
        return None
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise CheckpointError(
            f"{folder}: tokenizer_config.json {key} {token!r} is not in tokenizer.json's vocabulary"
        )
    return token_id


def _chat_template(folder: Path, config: dict) -> str | None:
    """The template from tokenizer_config.json (a string, or a list of named templates: 'default'), or
    from chat_template.jinja where newer transformers save it."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default", next(iter(named.values()), None))
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    return template
