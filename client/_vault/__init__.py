"""The local vault as the client uses it: memories, the client's own tables and keys."""
