import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

torch.set_num_threads(1)

settings.register_profile(
    "ccu",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ccu"))

#: files whose tests share nothing (no module fixture: each a papermill run or a workflow of a
#: minute): spread over the workers one by one. Every other file stays on one worker, which
#: builds its module fixtures (a trained run, a lease) once.
SPREAD = {"test_notebooks.py", "test_workflow.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    # ci/test.sh runs pytest-xdist with --dist loadgroup: a group runs on one worker
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
