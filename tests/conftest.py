"""Pytest fixtures shared by every test folder."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
