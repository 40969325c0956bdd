#!/bin/sh
exec python -m sglang.launch_server --model-path tiny-llama --cuda-graph-max-bs 64 "$@"
