"""The FlashInfer kernel set (``layer_set``) and FlashInfer's decode kernel bound for a breakable replay
(``decode_attention``). Every module here imports the optional ``flashinfer-python``; the registries import them only
when the set or the ``flashinfer`` attention backend is asked for, so this package's ``__init__`` imports nothing."""
