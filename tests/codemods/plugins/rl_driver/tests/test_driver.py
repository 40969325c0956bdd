from rl_plugin import driver


def test_the_rollout_arguments_enable_graphs():
    assert driver.graphs_enabled(driver.rollout_server_args())
    assert driver.rollout_engine().server_args.cuda_graph_max_bs == 16


def test_the_server_command_keeps_the_servers_own_flags():
    command = driver.server_command()
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert "--cuda-graph-max-bs" in command and command[-4:] == ["--cuda-graph-bs", "1", "2", "4"]
