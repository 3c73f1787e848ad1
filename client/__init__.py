"""The Engram Sync device side: relay client, syncer and the `engram-sync` CLI."""

__version__ = "0.1.0"
