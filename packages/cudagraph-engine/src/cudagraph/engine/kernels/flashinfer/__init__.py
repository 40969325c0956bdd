"""The FlashInfer kernel set (``layer_set``), FlashInfer's decode kernel bound for a breakable replay
(``decode_attention``), and the one adapter of FlashInfer's private wrapper attributes (``private_api``, with the
releases it is proven on), which the ``flashinfer`` attention backend reads too. The kernel modules import the
optional ``flashinfer-python``; the registries import them only when the set or the ``flashinfer`` attention backend
is asked for, so this package's ``__init__`` imports nothing."""
