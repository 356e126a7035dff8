"""What every API of the HTTP server shares: the state built at start (http_state.py), the guard that turns
failures into responses (response_guard.py), the request gate, the error bodies, SSE framing, the group of
choices one request sends (request_group.py), health, metrics and /server_info. It stands on tools/ and
reasoning.py (the parsers the state holds) and on no API."""
