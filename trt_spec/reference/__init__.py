"""CPU reference engine: PyTorch decoder runtime, speculative decoding, FP8 export (this package avoids torch)."""
