"""The OpenAI-compatible frontend: its own process in front of tritonserver."""
