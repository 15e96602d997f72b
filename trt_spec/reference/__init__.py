"""CPU reference engine: a lean PyTorch decoder runtime, speculative decoding, FP8 export (submodules import
torch; this package itself does not, so the n-gram drafter and the GGUF source resolver stay torch-free)."""
