"""What runs inside tritonserver, free of Triton: the speculative loop, the proposers, the
metrics publisher and the python models' shared helpers (imported by model_repo/)."""
