"""SGLang's model executor (stand-in)."""
