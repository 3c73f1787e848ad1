"""HTTP routes of the relay."""
