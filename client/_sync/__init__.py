"""The sync engine: the relay client, pull and push, the cursor state and the sync lock."""
