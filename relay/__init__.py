"""The Engram Sync relay: a zero-knowledge blob store on PostgreSQL (PROTOCOL §5-§14)."""

from engram_sync import __version__

__all__ = ["__version__"]
