"""An engine built on SGLang's model runner, counting and exposing its graphs."""
