"""libcst codemods that rewrite downstream code from the legacy CUDA-graph names to the cudagraph packages.

Run as ``cudagraph-migrate PATH...`` or ``nox -s migrate``. The renames come from one table, ``refactor/renames.toml``
(read through :mod:`cudagraph.config.renames`, which the shims read too). This package never imports torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
