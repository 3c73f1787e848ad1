"""Serving the relay: the ASGI app (Litestar) assembled from the routes, uvicorn with its
workers and connection guards, request ids and the log format."""
