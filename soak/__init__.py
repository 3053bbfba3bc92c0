"""The soak: a mixed load on a real `pamledger run` while every role and server is SIGKILLed, then an audit.

`python -m soak --duration 300` (or `make soak`); see soak/README.md. A dev tool beside bench, not shipped.
"""
