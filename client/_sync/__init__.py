"""The sync engine: pull and push, anti-entropy, the live change feed, the cursor state and
the sync lock."""
