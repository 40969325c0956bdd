"""Build SGLang's server arguments from the wrapper's YAML file."""

from pathlib import Path

from ruamel.yaml import YAML
from sglang.srt.server_args import ServerArgs

OPTIONS = Path(__file__).with_name("server.yaml")


def load_options(path: Path = OPTIONS) -> dict:
    return dict(YAML(typ="safe", pure=True).load(path.read_text()))


def server_args(path: Path = OPTIONS) -> ServerArgs:
    return ServerArgs(**load_options(path))
