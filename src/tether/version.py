"""tether's version, in one place (the root package and the server's OpenAPI document read it)."""

__version__ = "0.1.0"
