"""ChatChunkWalk (http_proc/apis/openai/chat_chunks.py): the one walk of chat chunks the Responses and
Messages translators share."""

from zserve.http_proc.apis.openai.chat_chunks import ChatChunkWalk, ChatPiece


def test_a_chunk_becomes_its_pieces_in_order():
    walk = ChatChunkWalk()
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": "hm", "content": "Sure.", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{\"a\": 1}"}},
    ]}, "finish_reason": None}]}
    assert list(walk.pieces(chunk)) == [
        ChatPiece("thinking", "hm"), ChatPiece("text", "Sure."), ChatPiece("call", "", 0, "call_1", "add"),
        ChatPiece("call", "{\"a\": 1}", 0),
    ]


def test_a_call_without_an_index_is_the_next_call():
    walk = ChatChunkWalk()
    calls = [{"id": "a", "function": {"name": "f", "arguments": "{}"}}, {"id": "b", "function": {"name": "g"}}]
    pieces = list(walk.pieces({"choices": [{"delta": {"tool_calls": calls}}]}))
    assert [(p.call_idx, p.call_id, p.name) for p in pieces] == [(0, "a", "f"), (1, "b", "g")]


def test_the_finish_reason_is_taken_after_its_choices_pieces_and_the_usage_from_the_last_chunk():
    walk = ChatChunkWalk()
    seen = [walk.finish_reason for _ in walk.pieces({"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]})]
    assert seen == [None] and walk.finish_reason == "length"
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert list(walk.pieces({"choices": [], "usage": usage})) == [] and walk.usage == usage
