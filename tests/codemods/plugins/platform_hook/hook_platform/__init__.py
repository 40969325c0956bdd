"""An out-of-tree hardware platform for SGLang whose graph runner is SGLang's own decode runner."""
