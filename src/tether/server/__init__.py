"""The HTTP server: the app factory, native routes, SSE, auth and problem+json errors.

Routes reach sessions, turns, memory and keys through the runtime's services, never the store.
"""
