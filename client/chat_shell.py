"""A terminal chat against a running server: streams answers, keeps the conversation.

Commands: /reset clears the conversation, /quit (or Ctrl-D) leaves. Ctrl-C while an answer
streams stops it (the request is aborted on the server) and keeps what came so far as the
assistant's turn; Ctrl-C at the prompt clears the line, as in Python's own shell. An answer is
at most 128 tokens unless --max-tokens says otherwise (`--max-tokens none`: up to the context).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from zserve.client.client import Client
from zserve.client.types import ServerError
from zserve.common.sampling_params import DEFAULT_MAX_TOKENS
from zserve.common.server_config import DEFAULT_CLIENT_PORT


def run_shell(
    address: str, *, max_tokens: int | None = DEFAULT_MAX_TOKENS, temperature: float = 0.0,
    stop_when: Callable[[], object] | None = None, api_key: str | None = None,
) -> None:
    messages: list[dict] = []
    print("zserve chat: /reset clears the conversation, Ctrl-C stops an answer, /quit or Ctrl-D leaves", flush=True)
    with Client(address, api_key=api_key) as client:
        while not (stop_when and stop_when()):
            try:
                if not chat_turn(client, messages, max_tokens=max_tokens, temperature=temperature):
                    return
            except EOFError:  # Ctrl-D
                print()
                return
            except KeyboardInterrupt:  # Ctrl-C at the prompt, or between the answer's pieces: back to the prompt
                print(flush=True)


def chat_turn(client: Client, messages: list[dict], *, max_tokens: int | None, temperature: float) -> bool:
    """Read one line and act on it; False when the user leaves."""
    line = input("> ").strip()
    if line in ("/quit", "/exit"):
        return False
    if line == "/reset":
        messages.clear()
        print("(conversation cleared)")
    elif line:
        messages.append({"role": "user", "content": line})
        answer = stream_answer(client, messages, max_tokens=max_tokens, temperature=temperature)
        if answer is None:
            messages.pop()  # the server refused the turn: the conversation stays as it was
        else:
            messages.append({"role": "assistant", "content": answer})
    return True


def stream_answer(client: Client, messages: list[dict], *, max_tokens: int | None, temperature: float) -> str | None:
    """Print the answer as it streams and return its text; on Ctrl-C, abort the request and
    return the text so far. None when the server refused the request (the error is printed)."""
    parts: list[str] = []
    stream = None
    try:
        stream = client.stream(messages=messages, max_tokens=max_tokens, temperature=temperature)
        for delta in stream:
            parts.append(delta)
            sys.stdout.write(delta)
            sys.stdout.flush()
    except KeyboardInterrupt:
        if stream is not None:
            stream.close()  # aborts the request on the server (one sent but not yet returned is aborted at exit)
        print(" [stopped]", flush=True)
        return "".join(parts)
    except ServerError as exc:
        print(f"\n[error] {exc}", flush=True)
        return None
    print(flush=True)
    return "".join(parts)


def max_tokens_arg(text: str) -> int | None:
    """--max-tokens: a number of tokens, or "none" (up to the context)."""
    return None if text.lower() == "none" else int(text)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zserve.client", description="Chat with a running zserve server.")
    parser.add_argument("--zmq-port", type=int, default=DEFAULT_CLIENT_PORT,
                        help="the server's ZMQ client port (launch_server --zmq-port; default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--max-tokens", type=max_tokens_arg, default=DEFAULT_MAX_TOKENS,
                        help="per answer, or none: up to the context (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0)
    ns = parser.parse_args(argv)
    run_shell(f"tcp://{ns.host}:{ns.zmq_port}", max_tokens=ns.max_tokens, temperature=ns.temperature)
