"""Stage 1, build: hardware, model facts, preflight, TensorRT-LLM's commands, the plan and its runner."""
