"""continue_final_message: the chat prompt ends right after the last (assistant) message's content, its turn
left open and no generation prompt added, exactly as transformers' apply_chat_template renders it."""

from __future__ import annotations

import pytest

from testing.tokenizer_fixtures import CHATML_TEMPLATE, LLAMA2_TEMPLATE, build_byte_level_bpe
from zserve.tokenizer_proc.chat_template import ChatTemplate, ChatTemplateError
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
TRIMMING = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama2": LLAMA2_TEMPLATE, "trimming": TRIMMING}
CONVERSATIONS = [
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}],
    [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "one, two, "}],  # a trailing space
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_byte_level_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def hf_tokenizer(model_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_path))
    hf.bos_token, hf.eos_token = SPECIALS["bos_token"], SPECIALS["eos_token"]
    return hf


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_renders_like_transformers(hf_tokenizer, name, messages):
    expected = hf_tokenizer.apply_chat_template(messages, chat_template=TEMPLATES[name], tokenize=False, continue_final_message=True)
    ours = ChatTemplate(TEMPLATES[name], name).render(messages, add_generation_prompt=False, special_tokens=SPECIALS,
                                                       continue_final_message=True)
    assert ours == expected
    closed = ChatTemplate(TEMPLATES[name], name).render(messages, add_generation_prompt=False, special_tokens=SPECIALS)
    assert closed.startswith(ours) and len(closed) > len(ours)  # the turn is left open: its closing is cut off


def test_a_template_that_drops_the_content_cannot_be_continued():
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        ChatTemplate("{% for m in messages %}[{{ m.role }}]{% endfor %}", "t").render(
            CONVERSATIONS[0], add_generation_prompt=False, special_tokens={}, continue_final_message=True)


def test_the_validator_continues_only_an_assistant_message(model_path):
    tokenizer = TextTokenizer.from_model_dir(model_path)
    validator = RequestValidator(tokenizer, context_len=512)
    messages = CONVERSATIONS[0]
    ids, _ = validator.validate({"messages": messages, "continue_final_message": True})
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\nThe colour is")
    plain, _ = validator.validate({"messages": messages})
    assert tokenizer.decode(plain).endswith("The colour is<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="must be the assistant's"):
        validator.validate({"messages": messages[:1], "continue_final_message": True})
    with pytest.raises(ValueError, match="needs messages, not a prompt"):
        validator.validate({"prompt": "The colour is", "continue_final_message": True})
    with pytest.raises(ValueError, match="continue_final_message must be a boolean"):
        validator.validate({"messages": messages, "continue_final_message": "yes"})
