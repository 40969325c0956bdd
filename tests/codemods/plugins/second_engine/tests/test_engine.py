from tiny_llm import LLM
from tiny_llm.llm import main
from tiny_llm.model_runner import ModelRunner


def test_the_engine_graphs_batches_up_to_its_max_and_runs_larger_ones_eagerly():
    llm = LLM("tiny", cuda_graph_max_bs=4)
    assert llm.model_runner.graph_runner.capture_bs == [1, 2, 4]
    assert llm.generate(3) == "graph[4]" and llm.generate(5) == "eager"


def test_graphs_off_leaves_no_graph_runner():
    assert ModelRunner(cuda_graph_max_bs=8, disable_cuda_graph=True).graph_runner is None


def test_the_command_line_sets_the_same_options():
    llm = main(["tiny", "--cuda-graph-max-bs", "2"])
    assert llm.model_runner.cuda_graph_max_bs == 2 and llm.generate(2) == "graph[2]"
    assert main(["tiny", "--disable-cuda-graph"]).generate(1) == "eager"
