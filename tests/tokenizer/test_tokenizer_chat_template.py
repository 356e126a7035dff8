"""ChatTemplate: renders like transformers, and the sandbox holds."""

from __future__ import annotations

import pytest

from testing.tokenizer_fixtures import CHATML_TEMPLATE, LLAMA2_TEMPLATE, build_byte_level_bpe
from zserve.tokenizer_proc.chat_template import ChatTemplate, ChatTemplateError

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Say "hi" <b>&</b> 你好 🙂'},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "again"},
]
# Features real templates use: tojson (unescaped, non-ASCII kept), namespace, loop controls,
# whitespace control under trim_blocks/lstrip_blocks, the generation tag, strftime_now, bos_token.
TEMPLATES = {
    "chatml": CHATML_TEMPLATE,
    "llama2": LLAMA2_TEMPLATE,
    "tojson": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ messages[1]['content'] | tojson(indent=2) }}",
    "namespace": (
        "{% set ns = namespace(n=0, last='') %}"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}{% endfor %}"
        "{{ ns.n }} {{ ns.last }}"
    ),
    "loopcontrols": (
        "{% for m in messages %}\n"
        "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "    {% if loop.index > 3 %}{% break %}{% endif %}\n"
        "  [{{ m.role }}]\n"
        "{% endfor %}\n"
        "{%- if add_generation_prompt %}GO{% endif %}"
    ),
    "generation": (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}"
        "{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
    ),
    "date": "{{ strftime_now('%Y') }}|{{ messages | length }}",
    "dict": "{% set d = dict(a=1) %}{{ d.a }}{{ messages[0].get('missing', 'x') }}",
}


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = build_byte_level_bpe(tmp_path_factory.mktemp("bl"))
    hf = AutoTokenizer.from_pretrained(str(path))
    hf.bos_token, hf.eos_token = SPECIALS["bos_token"], SPECIALS["eos_token"]
    return hf


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_like_transformers(hf_tokenizer, name, add_generation_prompt):
    source = TEMPLATES[name]
    messages = MESSAGES[1:] if name == "llama2" else MESSAGES
    expected = hf_tokenizer.apply_chat_template(
        messages, chat_template=source, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    specials = {k: v for k, v in hf_tokenizer.special_tokens_map.items() if isinstance(v, str)}
    ours = ChatTemplate(source, "test").render(messages, add_generation_prompt=add_generation_prompt, special_tokens=specials)
    assert ours == expected


def test_raise_exception_is_a_client_error():
    tpl = ChatTemplate(LLAMA2_TEMPLATE, "test")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        tpl.render([{"role": "assistant", "content": "x"}], add_generation_prompt=True, special_tokens=SPECIALS)
    assert issubclass(ChatTemplateError, ValueError)


def test_template_errors_on_odd_messages_are_client_errors():
    tpl = ChatTemplate("{{ messages[0]['content'] + 1 }}", "test")
    with pytest.raises(ChatTemplateError):
        tpl.render([{"role": "user", "content": "x"}], add_generation_prompt=True, special_tokens={})


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{% set ns = namespace() %}{% set ns._secret = 1 %}",
        "{{ namespace(_x=1) }}",
        "{% set x = messages.append(1) %}",  # immutable sandbox: no mutating containers
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_refuses_escapes(source):
    """Unsafe attributes are undefined (render as nothing) or raise; nothing leaks."""
    tpl = ChatTemplate(source, "test")
    try:
        out = tpl.render([{"role": "user", "content": "x"}], add_generation_prompt=True, special_tokens={})
    except ChatTemplateError:
        return
    assert out == ""


def test_compile_errors_name_the_origin():
    with pytest.raises(ValueError, match=r"some/file\.jinja: chat template does not compile"):
        ChatTemplate("{% if %}", "some/file.jinja")
    with pytest.raises(ValueError, match="empty"):
        ChatTemplate("  ", "x")


def test_none_valued_message_keys_are_dropped():
    tpl = ChatTemplate("{% for m in messages %}{{ m | tojson }}{% endfor %}", "test")
    out = tpl.render([{"role": "user", "content": "a", "name": None}], add_generation_prompt=False, special_tokens={})
    assert out == '{"role": "user", "content": "a"}'


def test_render_limits_time_output_and_any_exception_the_template_raises():
    import signal as signal_module

    spin = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "spin")
    fired: list[int] = []
    previous = signal_module.signal(signal_module.SIGALRM, lambda *_: fired.append(1))
    signal_module.setitimer(signal_module.ITIMER_REAL, 5.0)  # someone else's timer (pytest-timeout's, say)
    try:
        with pytest.raises(ChatTemplateError, match=r"took over 0.2s to render"):
            spin.render([], add_generation_prompt=True, special_tokens={}, timeout_s=0.2)
        remaining_s, _ = signal_module.getitimer(signal_module.ITIMER_REAL)
        assert 4.0 < remaining_s < 5.0 and not fired  # the outer timer runs on
    finally:
        signal_module.setitimer(signal_module.ITIMER_REAL, 0)
        signal_module.signal(signal_module.SIGALRM, previous)
    big = ChatTemplate("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "big")
    with pytest.raises(ChatTemplateError, match="passed 5000 characters"):
        big.render([], add_generation_prompt=True, special_tokens={}, max_chars=5000)
    zero = ChatTemplate("{{ 1 // 0 }}", "zero")
    with pytest.raises(ChatTemplateError, match="ZeroDivisionError"):
        zero.render([], add_generation_prompt=True, special_tokens={})


def test_with_chat_template_replaces_the_default_template(tmp_path):
    from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

    build_byte_level_bpe(tmp_path, vocab_size=300)
    tokenizer = TextTokenizer.from_model_dir(tmp_path)
    custom = tokenizer.with_chat_template("{% for m in messages %}[{{ m['content'] }}]{% endfor %}", "custom.jinja")
    assert custom.apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]"
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) != "[hi]"  # the original is untouched
    assert custom.has_chat_template and custom.vocab_size == tokenizer.vocab_size
