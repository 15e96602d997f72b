"""Stage 1, build: hardware, model facts, the memory plan, preflight, TensorRT-LLM's command surface, the plan and the
runner that executes it (trt-spec plan / build)."""
