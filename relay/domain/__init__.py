"""The relay's rules as values and pure functions: push validation, roles, API keys,
idempotency keys, admission decisions and the domain errors. No I/O, no HTTP."""
