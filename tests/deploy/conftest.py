"""Shared fixtures of the deployment tests: a real single-node Slurm, and the tiny random model of the
integration tests (re-exported from tests/integration/conftest.py)."""
from __future__ import annotations

import pytest

from tests.deploy.slurm_cluster import SlurmCluster, SlurmSetupError
from tests.integration.conftest import tiny_model  # noqa: F401 - a fixture, re-exported for tests/deploy


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """munged + slurmctld + slurmd on this host, in a temp dir; stopped (jobs cancelled, daemons killed) at
    the end of the session. Fails, naming the Debian package, where a binary is missing."""
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmSetupError as e:
        cluster.stop()
        pytest.fail(str(e), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
