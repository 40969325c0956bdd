"""SGLang's server arguments (the CUDA-graph options only)."""

import dataclasses


@dataclasses.dataclass
class ServerArgs:
    """The options a server is launched with."""

    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: list[int] | None = None
    disable_piecewise_cuda_graph: bool = False
    enable_cudagraph_gc: bool = False
