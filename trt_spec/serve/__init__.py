"""Stage 2 and 3, repository and serving: the Triton model repository writer (trt-spec repo) and the tritonserver launcher (trt-spec serve)."""
