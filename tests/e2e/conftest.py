"""End-to-end tests: the farm's tiny deployments (tests/farm.py) served by a real tritonserver (the binary bundled in
nvidia-pytriton); the fixtures are tests/conftest.py's."""

from __future__ import annotations

import pytest

from trt_spec.harness import client


@pytest.fixture(autouse=True, scope="session")
def short_client_timeout():
    """Requests on the tiny test models answer in seconds: a response that takes 2 minutes means the server is
    stuck, and the test should fail then (with the server log), not after the product's 10-minute default."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client, "REQUEST_TIMEOUT_S", 120.0)
        yield


@pytest.fixture(scope="session")
def chat_repo(farm, tmp_path_factory):
    """A copy of the farm's n-gram repository (its tokenizer has a chat template), for tests that serve it with
    `trt-spec serve` themselves (keys, load, fuzzing)."""
    return farm.copy_repo("ngram", tmp_path_factory.mktemp("chat") / "repo")
