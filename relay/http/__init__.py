"""The HTTP edge (PROTOCOL §5): the routes, authentication, strict JSON bodies, and the one
mapping of every domain refusal to its status and body (`errors`)."""
