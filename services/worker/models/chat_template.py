"""A checkpoint's chat template: Jinja2 rendered in a sandbox exactly as Hugging Face's
apply_chat_template does, so the same messages give the same prompt (and tokens) here as there."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.worker.models.errors import ChatTemplateError, CheckpointError, NoChatTemplateError

# A tokenizer_config.json may carry several named templates; these are the names HF picks by.
_DEFAULT = "default"
_TOOL_USE = "tool_use"


class ChatTemplate:
    """One model's chat template(s). source: the template text, or {name: text} as tokenizer_config.json
    lists several (then "default" serves plain chats and "tool_use", where present, chats with tools).
    bos_token / eos_token: the special tokens' text the template may print (None: the model has none).
    A template that does not compile is kept and refused at render time, so the model still serves
    plain completions."""

    def __init__(
        self, source: str | Mapping[str, str], bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        self.sources = {_DEFAULT: source} if isinstance(source, str) else dict(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        # The helpers HF puts in every template's reach; templates in the wild call them.
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._compiled: dict[str, jinja2.Template | jinja2.TemplateSyntaxError] = {}
        for name, text in self.sources.items():
            try:
                self._compiled[name] = env.from_string(text)
            except jinja2.TemplateSyntaxError as err:
                self._compiled[name] = err

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for messages (OpenAI-shaped dicts: role, content, optional name,
        tool_call_id, tool_calls) and tools (OpenAI-shaped {"type": "function", "function": {...}}),
        ending with the assistant's turn opening when add_generation_prompt. ChatTemplateError when the
        template refuses the messages (its raise_exception, or a render error); NoChatTemplateError when
        the template does not compile."""
        name = _TOOL_USE if tools and _TOOL_USE in self._compiled else _DEFAULT
        template = self._compiled.get(name) or next(iter(self._compiled.values()))
        if isinstance(template, jinja2.TemplateSyntaxError):
            raise NoChatTemplateError(f"the model's chat template does not compile: {template}")
        try:
            return template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:
            # The template's own loops and lookups fail on messages it was not written for.
            raise ChatTemplateError(f"the model's chat template cannot render them ({err})") from err


def load_chat_template(model_dir: Path) -> ChatTemplate | None:
    """The chat template a Hugging Face checkpoint directory ships, None when it has none: from
    chat_template.jinja, else chat_template.json, else tokenizer_config.json's chat_template (a string or
    a list of {"name", "template"}), with bos/eos token text from tokenizer_config.json. CheckpointError
    naming the file when one of them is malformed."""
    model_dir = Path(model_dir)
    config = _read_json(model_dir / "tokenizer_config.json")
    bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), bos, eos)
    source = _read_json(model_dir / "chat_template.json").get("chat_template") or config.get("chat_template")
    if source is None:
        return None
    if isinstance(source, list):
        try:
            source = {str(item["name"]): str(item["template"]) for item in source}
        except (KeyError, TypeError) as err:
            path = model_dir / "tokenizer_config.json"
            raise CheckpointError(path, f"chat_template list entries need name and template ({err})") from err
    if not isinstance(source, str | dict):
        raise CheckpointError(model_dir / "tokenizer_config.json", "chat_template is neither text nor a list")
    return ChatTemplate(source, bos, eos)


def _read_json(path: Path) -> dict[str, Any]:
    """path's JSON object, {} when the file does not exist; CheckpointError when it is not one."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(path, f"not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise CheckpointError(path, "expected a JSON object")
    return data


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json stores it: its text, or an AddedToken dict's content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # HF's tojson keeps non-ASCII text as it is (Jinja's own escapes it for HTML).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
