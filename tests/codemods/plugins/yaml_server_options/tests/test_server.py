from serve_options.server import load_options, server_args


def test_the_yaml_options_reach_server_args():
    assert load_options()["cuda_graph_max_bs"] == 64
    args = server_args()
    assert args.cuda_graph_max_bs == 64
    assert args.disable_cuda_graph is False
