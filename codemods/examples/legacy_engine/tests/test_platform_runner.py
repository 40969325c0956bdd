"""The platform runner plugin: importable, and its own helpers work, before and after migration."""

from toy_engine.platform_runner import PlatformGraphRunner


def test_graph_keys_name_the_platform_and_the_batch_size():
    assert PlatformGraphRunner.graph_key(8) == "toy-npu-bs8"


def test_it_is_still_a_decode_graph_runner():
    from cudagraph.runner import DecodeCudaGraphRunner

    assert issubclass(PlatformGraphRunner, DecodeCudaGraphRunner)
