"""Test-suite wide: `gpu`-marked tests are skipped where CUDA is not available; a local Ray kept between modules
(tests/integration/conftest.py, `ray_local`) is shut down before any test that does not use that fixture."""
import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures: a Ray kept by a previous module's `ray_local` goes, unless this test uses that
    same fixture (a module that defines its own `ray_local` gets no kept Ray either)."""
    from tests.integration import conftest as integration

    if not integration.KEPT["ray"]:
        return
    own = getattr(getattr(item, "module", None), "ray_local", integration.ray_local)  # a module's own fixture
    if "ray_local" not in getattr(item, "fixturenames", ()) or own is not integration.ray_local:
        integration.shut_down_kept_ray()


def pytest_sessionfinish(session, exitstatus):
    from tests.integration import conftest as integration

    integration.shut_down_kept_ray()
