"""The Triton kernel set (``layer_set``, on the fused kernels of ``ops``) and the Triton attention kernels
(``decode_attention``, ``extend_attention``). Every module here imports Triton; the registries import them only when
the set or the ``triton`` attention backend is asked for, so this package's ``__init__`` imports nothing."""
