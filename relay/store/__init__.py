"""SQL of the relay: one module per concern, each function takes a connection or pool."""
