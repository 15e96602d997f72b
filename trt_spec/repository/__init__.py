"""Stage 2, repository: the Triton model repository writers (trt-spec repo) and its memory plan."""
