"""A tiny Qwen3 model with Qwen3's thinking chat template, for the reasoning tests.

QWEN3_THINKING_TEMPLATE is written after Qwen3's own chat template (Qwen/Qwen3-8B's
tokenizer_config.json, which this machine cannot download): the tools system prompt with Hermes
`<tool_call>` blocks, the last user query found by walking the messages backwards, earlier
assistant turns' thinking dropped and the latest ones' kept in `<think>` blocks, tool answers in
`<tool_response>`, and the generation prompt's `enable_thinking` branch: thinking off writes an
empty `<think>\\n\\n</think>\\n\\n`, so the model answers at once.
"""

from __future__ import annotations

from pathlib import Path

from testing.model_fixtures import VOCAB_SIZE, make_tiny_checkpoint

THINK_OPEN_ID, THINK_CLOSE_ID = VOCAB_SIZE, VOCAB_SIZE + 1  # with make_tiny_qwen3_thinking(think_tokens=True)

QWEN3_THINKING_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + \
'\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def make_tiny_qwen3_thinking(target_dir: str | Path, think_tokens: bool = False) -> Path:
    """A tiny random Qwen3 checkpoint with the byte-level test tokenizer and Qwen3's thinking template.
    `think_tokens`: `<think>` and `</think>` are tokens of their own, as in Qwen3's vocabulary
    (added, not special: the text keeps them), ids THINK_OPEN_ID and THINK_CLOSE_ID past the
    byte-level tokens, so a test can bias the model toward closing its thinking; and a context of
    1024 tokens."""
    from tokenizers import AddedToken, Tokenizer

    # the ids, and a context that holds the tools' system prompt
    overrides = {"vocab_size": THINK_CLOSE_ID + 1, "max_position_embeddings": 1024} if think_tokens else {}
    target = make_tiny_checkpoint(target_dir, "qwen3", with_tokenizer=True, **overrides)
    (target / "chat_template.jinja").write_text(QWEN3_THINKING_TEMPLATE, encoding="utf-8")
    if think_tokens:
        tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
        assert [tokenizer.token_to_id(t) for t in ("<think>", "</think>")] == [THINK_OPEN_ID, THINK_CLOSE_ID]
        tokenizer.save(str(target / "tokenizer.json"))
    return target
