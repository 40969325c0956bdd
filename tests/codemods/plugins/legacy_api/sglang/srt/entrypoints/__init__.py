"""SGLang's entry points (stand-in)."""
