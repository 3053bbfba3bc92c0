"""The wire protocol both sides of the NATS binding read: subjects, headers, error codes, canonical JSON, value
checks, token forms, the request loop. Pure apart from `requests` (one NATS request) and `local` (reads files).

Why here: the server (schemas/, infra/, authz/) imports these modules rather than keeping its own copies, so
the SDK an agent installs alone and the service cannot disagree on a name or a code.
"""
