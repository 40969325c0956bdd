"""An out-of-tree platform plugin for SGLang: the platform's decode graph runner."""
