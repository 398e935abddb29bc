import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

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

# CCU_TEST_CPU=FILE: each test's CPU seconds (its worker's and those of the processes it ran and
# waited for: CLI steps, papermill kernels, snakemake jobs) appended to FILE as JSON lines; on
# 2 cores the suite's time is its CPU time over 2, so this says where that time goes
# (e.g. ``CCU_TEST_CPU=/tmp/cpu.jsonl bash ci/test.sh``, then sum by file)
if os.environ.get("CCU_TEST_CPU"):
    import json  # noqa: E402
    import resource  # noqa: E402

    import pytest  # noqa: E402

    def _cpu_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before = _cpu_seconds()
        yield
        spent = _cpu_seconds() - before
        with open(os.environ["CCU_TEST_CPU"], "a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(spent, 2)}) + "\n")
