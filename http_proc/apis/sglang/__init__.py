"""The native /generate, in zserve's shape or SGLang's."""
