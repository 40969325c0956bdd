"""An RL trainer's rollout driver for SGLang servers."""
