"""Stage 3, serve: the tritonserver launcher and supervisor (trt-spec serve) and the OpenAI frontend."""
