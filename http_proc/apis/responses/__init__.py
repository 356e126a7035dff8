"""OpenAI's Responses API (/v1/responses), translated onto the chat path (apis/openai/chat_call.py)."""
