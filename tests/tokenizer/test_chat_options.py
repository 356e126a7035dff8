"""How a request's messages become its prompt (ChatOptions): vLLM's `add_generation_prompt: false` and a request's own
`chat_template` give transformers' ids for the same options; the options' bad values are refused naming the field;
a request's template is compiled once and bounded."""

from __future__ import annotations

import pytest

from testing.qwen3_thinking import make_tiny_qwen3_thinking
from zserve.common.messages import TokenizeReq
from zserve.tokenizer_proc.chat_options import MAX_TEMPLATE_CHARS, NUM_KEPT_TEMPLATES, RequestTemplates
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer
from zserve.tokenizer_proc.tokenize_answer import answer_tokenize

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
# a template unlike the model's: roles in brackets, the generation prompt a marker of its own
OWN_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_qwen3_thinking(tmp_path_factory.mktemp("qwen3_chat_options"))


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def validator(model_dir):
    return RequestValidator(TextTokenizer.from_model_dir(model_dir), context_len=4096)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("own_template", [False, True])
def test_the_ids_are_transformers_for_the_same_options(validator, hf_tokenizer, add_generation_prompt, own_template):
    body = {"messages": MESSAGES, "add_generation_prompt": add_generation_prompt}
    theirs_kwargs = {}
    if own_template:
        body["chat_template"] = theirs_kwargs["chat_template"] = OWN_TEMPLATE
    ids, _ = validator.validate(body)
    theirs = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=add_generation_prompt,
                                              return_dict=False, **theirs_kwargs)
    assert ids == list(theirs)
    text = validator.tokenizer.decode(ids)
    assert ("[assistant]" in text) == (own_template and add_generation_prompt)


@pytest.mark.parametrize("body, error", [
    ({"add_generation_prompt": "no"}, "add_generation_prompt must be a boolean"),
    ({"continue_final_message": True, "add_generation_prompt": True}, "cannot both be true"),
    ({"chat_template": ""}, "chat_template must be a non-empty string"),
    ({"chat_template": "{% for m in messages %}"}, "chat template does not compile"),
    ({"chat_template": "x" * (MAX_TEMPLATE_CHARS + 1)}, "chat_template is more than"),
    ({"chat_template": "{{ raise_exception('no system messages') }}"}, "no system messages"),
])
def test_bad_options_are_refused_naming_the_field(validator, body, error):
    with pytest.raises(ValueError, match=error):
        validator.validate({"messages": MESSAGES, **body})


@pytest.mark.parametrize("name, value", [("add_generation_prompt", False), ("chat_template", OWN_TEMPLATE)])
def test_rendering_options_need_messages(validator, name, value):
    with pytest.raises(ValueError, match=f"{name} says how messages are rendered: it needs messages"):
        validator.validate({"prompt": "hi", name: value})


def test_a_request_template_is_compiled_once_and_only_the_last_few_are_kept():
    templates = RequestTemplates()
    first = templates.get(OWN_TEMPLATE)
    assert templates.get(OWN_TEMPLATE) is first
    for i in range(NUM_KEPT_TEMPLATES):
        templates.get(OWN_TEMPLATE + f"{{# {i} #}}")
    assert templates.get(OWN_TEMPLATE) is not first  # pushed out by the newer ones, compiled again


def test_tokenize_answers_token_strings_when_asked(validator, hf_tokenizer):
    out = answer_tokenize(validator, TokenizeReq(req_id=1, body={"prompt": "Why is the sky blue?",
                                                                 "return_token_strs": True}))
    assert out.error is None and out.token_strs == hf_tokenizer.convert_ids_to_tokens(out.input_ids)
    plain = answer_tokenize(validator, TokenizeReq(req_id=2, body={"prompt": "Why is the sky blue?"}))
    assert plain.input_ids == out.input_ids and plain.token_strs is None
