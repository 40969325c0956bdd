"""Legacy module paths and names kept importable, each warning once, until the removal version in `refactor/renames.toml`."""

__version__ = "0.1.0"

__all__ = ["__version__"]
