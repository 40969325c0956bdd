"""SGLang's platform interface (stand-in): what an out-of-tree platform plugin implements."""


class SRTPlatform:
    """A hardware platform. Out-of-tree platforms return their graph runner class from ``get_graph_runner_cls``."""

    def is_out_of_tree(self) -> bool:
        """Whether this platform comes from a plugin (SGLang then asks it for its subsystems)."""
        return True

    def get_graph_runner_cls(self) -> type:
        """Return the graph runner class for this platform."""
        raise NotImplementedError
