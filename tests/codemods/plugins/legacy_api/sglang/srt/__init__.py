"""SGLang's runtime package (stand-in)."""
