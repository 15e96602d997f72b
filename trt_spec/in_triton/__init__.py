"""What runs inside tritonserver, free of Triton: the speculative loop, proposers, metrics, model helpers."""
