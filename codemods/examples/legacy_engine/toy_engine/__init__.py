"""A toy engine in the legacy style: what `cudagraph-migrate` is for."""
