"""Reproducible benchmarks of the relay and the client (`python -m bench`, docs/benchmarks.md).

One run starts one PostgreSQL (or uses `DATABASE_URL`), runs the relay in a
separate process, drives it from this process, and writes
`bench/results/<UTC date>-<git short sha>.json` and `.md` (plus PNG plots when
matplotlib is installed).
"""
