"""The `engram-relay` command line: serve, the admin commands, backup and restore, and the
entry point that says what to install when the relay extra is missing (`launch`)."""
