"""What a Hugging Face model directory says about its tokenizer, read as plain JSON and text.

Sources, as transformers 5 reads them:
- tokenizer.json: the `tokenizers` pipeline (required);
- tokenizer_config.json: named special tokens, and the chat template (a string, or a list of
  `{"name", "template"}`);
- special_tokens_map.json: named special tokens, for the ones tokenizer_config.json lacks;
- chat_template.jinja and additional_chat_templates/*.jinja: templates as separate files, which
  take priority over the ones in tokenizer_config.json;
- generation_config.json and config.json: more EOS ids (`eos_token_id`, an int or a list).
Every error names the file it is about.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKENIZER_JSON = "tokenizer.json"
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class TokenizerFiles:
    model_dir: Path
    tokenizer_json: Path  # checked to exist; parsed by tokenizers.Tokenizer.from_file
    special_tokens: dict[str, str] = field(default_factory=dict)  # "bos_token" -> "<s>", named ones only
    extra_special_tokens: tuple[str, ...] = ()
    chat_templates: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (source, origin file)
    eos_token_ids: tuple[int, ...] = ()  # from generation_config.json and config.json

    @staticmethod
    def read(model_dir: str | Path) -> TokenizerFiles:
        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"model directory {root} does not exist")
        tok_path = root / TOKENIZER_JSON
        if not tok_path.is_file():
            raise FileNotFoundError(
                f"{tok_path} not found: zserve needs the fast tokenizer file tokenizer.json in the model directory"
            )

        config = _read_json(root / "tokenizer_config.json")
        legacy_map = _read_json(root / "special_tokens_map.json")
        special_tokens: dict[str, str] = {}
        for key in NAMED_SPECIAL_TOKENS:
            for source, name in ((config, "tokenizer_config.json"), (legacy_map, "special_tokens_map.json")):
                if key in source and source[key] is not None:
                    special_tokens[key] = _token_content(source[key], root / name, key)
                    break
        extra: list[str] = []
        for source, name in ((config, "tokenizer_config.json"), (legacy_map, "special_tokens_map.json")):
            for key in ("additional_special_tokens", "extra_special_tokens"):
                values = source.get(key) or []
                if isinstance(values, dict):  # transformers 5: {"name": token}
                    values = list(values.values())
                if not isinstance(values, list):
                    raise ValueError(f"{root / name}: {key} must be a list, got {type(values).__name__}")
                extra += [_token_content(v, root / name, key) for v in values]

        eos_ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = _read_json(root / name).get("eos_token_id")
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is None:
                    continue
                if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                    raise ValueError(f"{root / name}: eos_token_id must be non-negative integers, got {value!r}")
                if token_id not in eos_ids:
                    eos_ids.append(token_id)

        return TokenizerFiles(
            model_dir=root,
            tokenizer_json=tok_path,
            special_tokens=special_tokens,
            extra_special_tokens=tuple(dict.fromkeys(extra)),
            chat_templates=_chat_templates(root, config),
            eos_token_ids=tuple(eos_ids),
        )


def _chat_templates(root: Path, config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    files: dict[str, tuple[str, str]] = {}
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        files["default"] = (_read_text(jinja_file), str(jinja_file))
    extra_dir = root / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            files[path.name.removesuffix(".jinja")] = (_read_text(path), str(path))
    if files:
        return files
    origin = str(root / "tokenizer_config.json")
    value = config.get("chat_template")
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": (value, origin)}
    if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= set(t) for t in value):
        return {t["name"]: (t["template"], origin) for t in value}
    raise ValueError(f"{origin}: chat_template must be a string or a list of {{name, template}} objects")


def _token_content(value: Any, path: Path, key: str) -> str:
    # A token is a string or a serialized AddedToken {"content": ..., "lstrip": ..., ...}.
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path}: {key} must be a non-empty string or an object with 'content', got {value!r}")
    return value


def _read_json(path: Path) -> dict[str, Any]:
    """The file's object, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
