"""TextTokenizer: same ids and chat text as transformers' AutoTokenizer (the oracle), clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testing.tokenizer_fixtures import (
    CHATML_TEMPLATE,
    build_byte_level_bpe,
    build_metaspace_bpe,
    demo_tokenizer_dir,
)
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

TEXTS = (
    "Hello world",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "a  b   c\t\td\n\ne",
    "Numbers 1234567890 and 3.14",
    "你好，世界！ café naïve 🙂🚀👍🏽 👩‍💻 한국어",
    "<s>special</s> in text <|im_start|>user<|im_end|>",
    "<|endoftext|>",
    "\n",
    " ",
    "x",
    "",
)
CONVERSATIONS = (
    [{"role": "user", "content": "Hi there!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "你好 🙂"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "  again  "},
    ],
    [{"role": "user", "content": "x", "name": None}],
)


@pytest.fixture(scope="module")
def fixture_dirs(tmp_path_factory) -> dict[str, Path]:
    dirs = {
        "byte_level": build_byte_level_bpe(tmp_path_factory.mktemp("byte_level")),
        "metaspace": build_metaspace_bpe(tmp_path_factory.mktemp("metaspace")),
    }
    if demo_tokenizer_dir() is not None:
        dirs["smollm2"] = demo_tokenizer_dir()
    return dirs


@pytest.fixture(scope="module", params=["byte_level", "metaspace", "smollm2"])
def pair(request, fixture_dirs) -> tuple[TextTokenizer, object]:
    """(ours, transformers' AutoTokenizer) on the same model directory."""
    if request.param not in fixture_dirs:
        pytest.skip("demo model (SmolLM2-135M-Instruct) not present; zserve-fetch-demo builds it")
    from transformers import AutoTokenizer

    path = fixture_dirs[request.param]
    return TextTokenizer.from_model_dir(path), AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(pair, text):
    ours, hf = pair
    assert ours.encode(text) == hf(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_encode_random_text_matches_transformers(pair, text):
    ours, hf = pair
    assert ours.encode(text) == hf(text)["input_ids"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_matches_transformers(pair, data):
    ours, hf = pair
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=30))
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(pair, messages, add_generation_prompt):
    ours, hf = pair
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False)
    assert ours.apply_chat_template(messages, add_generation_prompt) == text
    assert ours.encode_chat(messages, add_generation_prompt) == list(ids)


def test_chat_template_writes_bos_once(fixture_dirs):
    tok = TextTokenizer.from_model_dir(fixture_dirs["metaspace"])
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert tok.adds_bos and ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


def test_special_ids_and_sizes_match_transformers(pair):
    ours, hf = pair
    assert ours.vocab_size == len(hf)
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_ids[0] == hf.eos_token_id
    assert ours.special_tokens == {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)}


def test_fixture_properties(fixture_dirs):
    byte_level = TextTokenizer.from_model_dir(fixture_dirs["byte_level"])
    assert (byte_level.vocab_size, byte_level.eos_token_ids, byte_level.bos_token_id) == (600, (2,), 1)
    assert not byte_level.adds_bos and byte_level.invalid_byte_token_id is None
    metaspace = TextTokenizer.from_model_dir(fixture_dirs["metaspace"])
    assert (metaspace.vocab_size, metaspace.eos_token_ids, metaspace.bos_token_id) == (700, (2,), 1)
    assert metaspace.adds_bos and metaspace.invalid_byte_token_id is not None
    assert len(metaspace.encode("🙂", add_special_tokens=False)) == 5  # "▁" + four byte tokens


def test_fixture_builder_writes_into_an_existing_model_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    build_byte_level_bpe(tmp_path, vocab_size=1024)
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama"}
    assert TextTokenizer.from_model_dir(tmp_path).vocab_size == 1024
    with pytest.raises(ValueError, match="vocab_size"):
        build_metaspace_bpe(tmp_path / "small", vocab_size=100)


# ---- model directory variants -------------------------------------------------------------


def copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del cfg[k]
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def test_eos_ids_are_the_union_with_generation_and_model_config(fixture_dirs, tmp_path):
    d = copy_dir(fixture_dirs["byte_level"], tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (d / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert TextTokenizer.from_model_dir(d).eos_token_ids == (2, 0, 5)


def test_named_chat_templates_and_jinja_files(fixture_dirs, tmp_path):
    d = copy_dir(fixture_dirs["metaspace"], tmp_path / "named")
    edit_config(d, chat_template=[{"name": "default", "template": CHATML_TEMPLATE}, {"name": "rag", "template": "x"}])
    tok = TextTokenizer.from_model_dir(d)
    assert sorted(tok.chat_templates) == ["default", "rag"]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")

    edit_config(d, chat_template=[{"name": "rag", "template": "x"}])
    with pytest.raises(ValueError, match="none named 'default'"):
        TextTokenizer.from_model_dir(d).apply_chat_template([{"role": "user", "content": "hi"}])

    # chat_template.jinja (transformers 5's layout) wins over tokenizer_config.json
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert TextTokenizer.from_model_dir(d).apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


def test_no_chat_template_is_a_clear_error_only_for_chat(fixture_dirs, tmp_path):
    d = copy_dir(fixture_dirs["metaspace"], tmp_path / "plain")
    edit_config(d, chat_template=None)
    tok = TextTokenizer.from_model_dir(d)
    assert not tok.has_chat_template and tok.encode("hi")
    with pytest.raises(ValueError, match="no chat template"):
        tok.encode_chat([{"role": "user", "content": "hi"}])


def test_missing_or_malformed_files_name_the_file(fixture_dirs, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextTokenizer.from_model_dir(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        TextTokenizer.from_model_dir(empty)

    d = copy_dir(fixture_dirs["byte_level"], tmp_path / "bad_json")
    (d / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        TextTokenizer.from_model_dir(d)

    d = copy_dir(fixture_dirs["byte_level"], tmp_path / "bad_config")
    (d / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: not valid JSON"):
        TextTokenizer.from_model_dir(d)

    d = copy_dir(fixture_dirs["byte_level"], tmp_path / "bad_template")
    (d / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match=r"chat_template\.jinja: chat template does not compile"):
        TextTokenizer.from_model_dir(d)

    d = copy_dir(fixture_dirs["byte_level"], tmp_path / "bad_eos")
    (d / "generation_config.json").write_text('{"eos_token_id": "two"}')
    with pytest.raises(ValueError, match=r"generation_config\.json: eos_token_id"):
        TextTokenizer.from_model_dir(d)


def test_special_tokens_missing_from_tokenizer_json_are_added(fixture_dirs, tmp_path):
    d = copy_dir(fixture_dirs["metaspace"], tmp_path / "extra")
    edit_config(d, pad_token="<pad>", additional_special_tokens=["<tool>"])
    ours = TextTokenizer.from_model_dir(d)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(d))
    assert ours.vocab_size == len(hf) == 702
    text = "a<pad>b<tool>c"
    assert ours.encode(text) == hf(text)["input_ids"]
    assert ours.decode(ours.encode(text), skip_special_tokens=True) == hf.decode(hf(text)["input_ids"], skip_special_tokens=True)
