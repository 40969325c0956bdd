"""An RL framework's rollout workers, driving SGLang with options gathered in dicts."""
