"""Chat templates as Hugging Face renders them: where a checkpoint keeps its template, named templates,
the helpers templates call, and the errors a caller can act on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.worker.models.chat_template import ChatTemplate, load_chat_template
from services.worker.models.errors import ChatTemplateError, CheckpointError, NoChatTemplateError

HI = [{"role": "user", "content": "hi"}]
SIMPLE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}>{% endif %}"
)


def test_renders_with_specials_and_generation_prompt() -> None:
    template = ChatTemplate("{{ bos_token }}" + SIMPLE + "{{ eos_token }}", bos_token="<s>", eos_token="</s>")
    assert template.render(HI) == "<s>[user]hi></s>"
    assert template.render(HI, add_generation_prompt=False) == "<s>[user]hi</s>"


def test_tools_pick_the_tool_use_template_and_tojson_keeps_unicode() -> None:
    named = {"default": SIMPLE, "tool_use": "{{ tools | tojson }}|" + SIMPLE}
    tools = [{"type": "function", "function": {"name": "météo"}}]
    template = ChatTemplate(named)
    assert template.render(HI) == "[user]hi>"
    assert template.render(HI, tools) == json.dumps(tools, ensure_ascii=False) + "|[user]hi>"


@pytest.mark.parametrize(
    ("source", "error", "words"),
    [
        ("{{ raise_exception('roles must alternate') }}", ChatTemplateError, "roles must alternate"),
        ("{{ messages[0].content.nope() }}", ChatTemplateError, "cannot render"),
        ("{% for m in messages %}", NoChatTemplateError, "does not compile"),
        # The sandbox keeps a template away from Python internals.
        ("{{ messages.__class__.__mro__ }}", ChatTemplateError, "cannot render"),
    ],
    ids=["raise_exception", "render-error", "syntax-error", "sandboxed"],
)
def test_errors(source: str, error: type[Exception], words: str) -> None:
    template = ChatTemplate(source)
    with pytest.raises(error, match=words):
        template.render(HI)


def _write(model_dir: Path, name: str, content: object) -> None:
    text = content if isinstance(content, str) else json.dumps(content)
    (model_dir / name).write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("files", "rendered"),
    [
        ({"tokenizer_config.json": {"chat_template": SIMPLE, "bos_token": {"content": "<s>"}}}, "[user]hi>"),
        ({"tokenizer_config.json": {"chat_template": [{"name": "default", "template": "D"}]}}, "D"),
        (
            {"tokenizer_config.json": {"chat_template": "T"}, "chat_template.json": {"chat_template": "J"}},
            "J",
        ),
        (
            {"tokenizer_config.json": {"chat_template": "T"}, "chat_template.jinja": "{{ bos_token }}F"},
            "<s>F",
        ),
    ],
    ids=["config-string", "config-list", "chat_template.json-first", "jinja-file-first"],
)
def test_load_from_a_checkpoint_directory(tmp_path: Path, files: dict[str, object], rendered: str) -> None:
    files = {"tokenizer_config.json": {}, **files}
    config = dict(files["tokenizer_config.json"])  # type: ignore[arg-type]
    config.setdefault("bos_token", "<s>")
    files["tokenizer_config.json"] = config
    for name, content in files.items():
        _write(tmp_path, name, content)
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render(HI) == rendered


def test_no_template_and_bad_files(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    _write(tmp_path, "tokenizer_config.json", {"bos_token": "<s>"})
    assert load_chat_template(tmp_path) is None
    _write(tmp_path, "tokenizer_config.json", "{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not valid JSON"):
        load_chat_template(tmp_path)
    _write(tmp_path, "tokenizer_config.json", {"chat_template": [{"template": "x"}]})
    with pytest.raises(CheckpointError, match="name and template"):
        load_chat_template(tmp_path)
