"""Shared set-up of the Python suite: 8 host CPU devices for JAX (set before JAX is imported),
a printed seed for every randomized test, and where the tessel CLI is."""
import os
import random
import shutil
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

# Test data from real projects, beside the repository (read-only).
SHARED = os.environ.get("TESSEL_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))


def cli() -> str:
    """The tessel executable: $TESSEL_CLI (a build tree's), else the installed package's."""
    exe = os.environ.get("TESSEL_CLI")
    if exe:
        return exe
    from tessel.__main__ import executable

    return executable()


@pytest.fixture
def rng(request):
    """A random.Random whose seed is printed (shown with a failure); TESSEL_TEST_SEED fixes it."""
    seed = int(os.environ.get("TESSEL_TEST_SEED", random.randrange(2**32)))
    print(f"{request.node.nodeid}: seed {seed} (rerun with TESSEL_TEST_SEED={seed})")
    return random.Random(seed)


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


@pytest.fixture
def x64():
    """64-bit types in JAX for this test (int64/float64 leaves), restored afterwards."""
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
