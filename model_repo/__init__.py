"""The Triton python-backend models trt-spec deploys, one folder per model as NVIDIA's `all_models/` is laid out
(`NAME/1/model.py`). Data, not code to import: each model.py imports triton_python_backend_utils, which exists only
inside a Triton stub; `trt-spec repo` copies them next to the config.pbtxt it generates. Shipped inside the wheel as
`trt_spec.model_repo` (pyproject.toml: package-dir)."""
