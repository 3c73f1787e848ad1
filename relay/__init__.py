"""The Engram Sync relay: a zero-knowledge blob store on PostgreSQL (PROTOCOL §5-§14)."""

__version__ = "0.1.0"
