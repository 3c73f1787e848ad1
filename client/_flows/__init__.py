"""What a command runs on an open session: re-key a vault, switch to a successor vault, and
the watch loop that syncs on every change."""
