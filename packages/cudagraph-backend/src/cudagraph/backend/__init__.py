"""How one shape is captured and replayed: the full, breakable and tc_piecewise backends behind one factory, `make_backend`."""

__version__ = "0.1.0"

__all__ = ["__version__"]
