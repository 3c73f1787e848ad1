"""Accounts and teams: sign-in, key wraps, pairing codes, the handoff and vault grants."""
