"""OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models, /v1/embeddings, and vLLM's /tokenize."""
