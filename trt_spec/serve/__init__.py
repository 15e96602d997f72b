"""Stage 3, serve: the tritonserver launcher and supervisor (trt-spec serve) and the OpenAI-compatible frontend it can
start beside Triton."""
