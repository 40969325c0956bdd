"""SGLang's platform registry (stand-in): ``current_platform`` says whether an out-of-tree platform plugin is active
and, if so, which graph runner class the model runner builds, as ``cls(model_runner)``."""

from sglang.srt.platforms.interface import SRTPlatform


class _InTreePlatform(SRTPlatform):
    """CUDA, built into SGLang: the model runner picks its own graph runner."""

    def is_out_of_tree(self) -> bool:
        return False


current_platform: SRTPlatform = _InTreePlatform()


def activate_platform(platform: SRTPlatform | None) -> None:
    """Make ``platform`` the current one (None: back to the in-tree one); SGLang loads it from an entry point."""
    global current_platform
    current_platform = platform if platform is not None else _InTreePlatform()
