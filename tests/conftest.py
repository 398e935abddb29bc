import json
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    """One torch thread and the hypothesis profile, in each process that runs tests: not in
    pytest-xdist's controller, which runs none (torch and hypothesis cost it 4 s of CPU)."""
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch
    from hypothesis import HealthCheck, settings

    torch.set_num_threads(1)
    settings.register_profile(
        "ccu",
        deadline=None,
        max_examples=40,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ccu"))


# The tests heaviest first (each file by the CPU seconds its tests took when last measured,
# heaviest file first, and in a file its heaviest test first), so that pytest-xdist's two
# workers, handed one test at a time (ci/test.sh: --maxschedchunk 1), never end on a long test
# that one worker started while the other ran out of work (the longest-first rule). A file's
# tests stay together, so module fixtures are built once per worker as before. The order
# changes no result: only when the suite ends. Tests marked ``late`` come after all others (they
# start from a folder that a heavier test builds once: a worker handed one early would wait for
# it). Costs: tests/cpu_seconds.json (a test not in it counts 0); to measure them again:
# CCU_TEST_CPU=/tmp/cpu.jsonl bash ci/test.sh, then
# python tools/test_costs.py /tmp/cpu.jsonl --write tests/cpu_seconds.json.
COSTS = Path(__file__).with_name("cpu_seconds.json")


def pytest_collection_modifyitems(items):
    costs = json.loads(COSTS.read_text()) if COSTS.is_file() else {}
    by_file: dict[str, float] = {}
    for item in items:
        by_file[item.location[0]] = by_file.get(item.location[0], 0.0) + costs.get(item.nodeid, 0)
    position = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(
        key=lambda it: (
            it.get_closest_marker("late") is not None,
            -by_file[it.location[0]],
            it.location[0],
            -costs.get(it.nodeid, 0),
            position[it.nodeid],
        )
    )


# CCU_TEST_CPU=FILE: each test's CPU seconds (its worker's and those of the processes it ran and
# waited for: CLI steps, papermill kernels, snakemake jobs), its worker and its start and end
# (wall clock) appended to FILE as JSON lines; on 2 cores the suite's time is its CPU time over
# 2, so this says where that time goes and when a worker was idle (tools/test_costs.py FILE
# sums them by file and draws each worker's time line)
if os.environ.get("CCU_TEST_CPU"):
    import resource  # noqa: E402
    import sys  # noqa: E402
    import time  # noqa: E402

    import pytest  # noqa: E402

    def _cpu_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        # and the processes forked for the tests (tests/forked.py: not this worker's children)
        forked = sys.modules.get("forked")
        return (own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime
                + (forked.CPU_SECONDS if forked else 0.0))  # fmt: skip

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before, start = _cpu_seconds(), time.time()
        yield
        spent, end = _cpu_seconds() - before, time.time()
        record = {
            "test": item.nodeid,
            "cpu_s": round(spent, 2),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "start": round(start, 2),
            "end": round(end, 2),
        }
        with open(os.environ["CCU_TEST_CPU"], "a") as f:
            f.write(json.dumps(record) + "\n")
