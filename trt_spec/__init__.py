"""trt-spec: speculative decoding on Triton with TensorRT-LLM."""

__version__ = "0.1.0"
