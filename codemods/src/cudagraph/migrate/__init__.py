"""libcst codemods, run by `cudagraph-migrate` or `nox -s migrate`, that rewrite downstream code from the legacy names to the cudagraph packages."""

__version__ = "0.1.0"

__all__ = ["__version__"]
