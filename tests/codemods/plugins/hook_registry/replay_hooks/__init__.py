"""Around-hooks on SGLang's graph runner, registered by dotted method path, and a private-method patch helper."""
