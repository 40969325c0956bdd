from rl_plugin import driver
from sglang.srt.server_args import prepare_server_args


def test_the_rollout_arguments_enable_graphs():
    assert driver.graphs_enabled(driver.rollout_server_args())
    assert driver.rollout_server_args().cuda_graph_bs == [1, 2, 4, 8]


def test_the_reference_engine_runs_eagerly():
    assert not driver.graphs_enabled(driver.reference_engine().server_args)


def test_sglang_parses_the_rollout_command_as_meant():
    command = driver.rollout_command()
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert graphs_enabled_by(command) and prepare_server_args(command[3:]).cuda_graph_max_bs == 8


def test_sglang_parses_the_eval_command_as_meant():
    command = driver.eval_command()
    server_args = prepare_server_args(command[3:])
    assert server_args.disable_cuda_graph and server_args.disable_piecewise_cuda_graph
    assert server_args.cuda_graph_bs == [1, 2, 4] and not graphs_enabled_by(command)


def graphs_enabled_by(command):
    return driver.graphs_enabled(prepare_server_args(command[3:]))
