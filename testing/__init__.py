"""Test support for zserve's tests and benchmarks: fixtures that build tiny models and tokenizers,
the fake model and scheduler harness, a helper that starts a real server, and an HTTP test client.

Nothing in the product packages imports this package.
"""
