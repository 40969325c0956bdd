"""The engine's kernels: what a decoder layer computes besides attention (a kernel set), and the attention kernels
the attention backends launch. Nothing here chooses an attention backend, plans metadata or binds a break: that is
``cudagraph.engine.attention``, the graph-facing side.

One shape for every set. The interface, the plain-torch reference and the choice sit at the top; each set on an
optional package is a subpackage named after that package, holding its layer set (``layer_set``: the
``LayerKernels`` implementation and its ``warm_up``) and the attention kernels it brings (``*_attention``):

``layer_set``
    ``LayerKernels`` (the interface a layer computes through), ``RotaryStep``, ``QKHeads`` (a layer's q and k
    heads and their norm), ``KVDestination``, ``ComposedKernels`` (compound
    operations from single ones) and ``TorchKernels`` (the reference: plain torch, runs anywhere, traces under
    ``torch.compile``). The torch attention backend computes with torch ops of its own, so it brings no kernel here.
``registry``
    Which set a model computes through: ``KERNEL_BACKENDS`` (name -> requirements and loader), ``select_kernels``
    and ``auto``'s order. A set on an optional package is imported only when chosen (``optional_import``).
``rotary``, ``out_views``
    What every set shares: the rotary tables (and rotary in plain torch), and ``compute_into``.
``triton`` (Triton, which CUDA builds of torch ship)
    ``ops`` (the fused norm, rotary, GEMV and activation kernels and their launchers), ``lora`` (the batched LoRA
    delta in two kernels, on plain tensors: the adapters lay them out), ``traced_ops`` (the set's
    operations as torch custom ops, which a forward ``torch.compile`` traces calls instead), ``layer_set``
    (``TritonKernels``), ``decode_attention`` (paged decode in one kernel a layer), ``extend_attention`` (paged
    extend), ``moe`` (a decode step's mixture-of-experts experts as GEMVs, which ``model.moe`` calls) and ``pdl``
    (whether every kernel here launches as a programmatic dependent launch, and the switch).
``flashinfer`` (the optional ``flashinfer-python``)
    ``layer_set`` (``FlashInferKernels``) and ``decode_attention`` (FlashInfer's decode kernel bound for a
    breakable replay's breaks).

A plain ``import cudagraph.engine.kernels`` imports neither Triton nor FlashInfer. The kernels read a model's
architecture (``model.architecture.ModelConfig``) only as a type; the model imports the kernels, never the other way
round. An engine author copies none of this: the kernels are here so the graphs are worth measuring.
"""

from .layer_set import TORCH_KERNELS, ComposedKernels, KVDestination, LayerKernels, QKHeads, RotaryStep, TorchKernels
from .registry import (
    AUTO_ORDER,
    KERNEL_BACKEND_CHOICES,
    KERNEL_BACKENDS,
    KernelBackendError,
    KernelBackendUnavailableError,
    KernelTarget,
    check_kernel_backend,
    select_kernels,
)

__all__ = [
    "AUTO_ORDER",
    "KERNEL_BACKENDS",
    "KERNEL_BACKEND_CHOICES",
    "TORCH_KERNELS",
    "ComposedKernels",
    "KVDestination",
    "KernelBackendError",
    "KernelBackendUnavailableError",
    "KernelTarget",
    "LayerKernels",
    "QKHeads",
    "RotaryStep",
    "TorchKernels",
    "check_kernel_backend",
    "select_kernels",
]
