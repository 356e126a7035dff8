"""One wing per API the server speaks: openai/ (completions, chat, embeddings, tokenize), sglang/ (/generate),
responses/ and anthropic/ (translated onto the chat path of openai/). Each holds its protocol (the request's
shape), its route, and where it has one its events (the streamed answer's shape)."""
