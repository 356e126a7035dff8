"""Anthropic's Messages API (/v1/messages), translated onto the chat path (apis/openai/chat_call.py)."""
