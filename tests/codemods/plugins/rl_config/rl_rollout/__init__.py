"""An RL framework's rollout side: launch settings for SGLang servers and a wrapper around SGLang's model runner."""
