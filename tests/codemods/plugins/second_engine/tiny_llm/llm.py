"""This engine's entry points: ``LLM(..., cuda_graph_max_bs=...)`` and its own command line."""

import argparse

from tiny_llm.model_runner import ModelRunner

DEFAULTS = {"cuda_graph_max_bs": 8}


class LLM:
    def __init__(self, model, cuda_graph_max_bs=None, disable_cuda_graph=False):
        self.model = model
        options = dict(DEFAULTS)
        if cuda_graph_max_bs is not None:
            options["cuda_graph_max_bs"] = cuda_graph_max_bs
        options.setdefault("disable_cuda_graph", disable_cuda_graph)
        self.model_runner = ModelRunner(**options)

    def generate(self, batch_size):
        return self.model_runner.forward(batch_size)


def build_parser():
    parser = argparse.ArgumentParser(prog="tiny-llm")
    parser.add_argument("model")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=8)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return LLM(args.model, cuda_graph_max_bs=args.cuda_graph_max_bs, disable_cuda_graph=args.disable_cuda_graph)
