from rl_dicts import rollout


def test_the_rollout_server_graphs_the_trainers_batch_sizes():
    server_args = rollout.rollout_server_args(enforce_eager=False, batch_sizes=(1, 2, 4))
    assert server_args.cuda_graph_bs == [1, 2, 4] and rollout.graphs_enabled(server_args)


def test_an_eager_trainer_config_turns_graphs_off():
    assert not rollout.graphs_enabled(rollout.rollout_server_args(enforce_eager=True, batch_sizes=(1,)))


def test_a_rollout_engine_defaults_to_graphs_capped_at_the_rollout_batch():
    engine = rollout.rollout_engine()
    assert rollout.graphs_enabled(engine.server_args) and engine.server_args.cuda_graph_max_bs == 16
    assert rollout.rollout_engine(cuda_graph_max_bs=64).server_args.cuda_graph_max_bs == 16
    assert not rollout.graphs_enabled(rollout.rollout_engine(disable_cuda_graph=True).server_args)


def test_the_reference_engine_runs_eagerly():
    assert not rollout.graphs_enabled(rollout.reference_engine().server_args)
