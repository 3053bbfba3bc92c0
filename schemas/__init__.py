"""Wire truth (kernel): every wire and ledger type as msgspec Structs, canonical bytes, errors, replies.

What lives here: commands, events, the Memory Version envelope, the Query request (queries), the error
envelope and the server-side error hierarchy (errors), reply rendering and header names (replies), the
type registry and transition tables. Pure: no I/O. It may import only schemas/.
"""
