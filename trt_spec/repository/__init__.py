"""Stage 2, repository: the Triton model repository writer (trt-spec repo), one writer per runtime, and the memory plan
read from the repository as written."""
