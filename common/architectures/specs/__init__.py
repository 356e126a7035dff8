"""One module per architecture, each holding its `SPEC` (an ArchSpec); common/architectures/__init__.py
collects them into ARCHITECTURES. Adding an architecture adds a module here (see the README)."""
