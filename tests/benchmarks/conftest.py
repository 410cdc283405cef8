from tests.benchmarks import smoke_process


def pytest_collection_modifyitems(config, items):
    """The tests that read the benchmark smoke run go last, and the run starts now: it runs beside the
    rest of the suite (saving its ~2 min of waiting) and is done by the time they need it."""
    readers = [item for item in items if "smoke_run" in getattr(item, "fixturenames", ())]
    if not readers:
        return
    items[:] = [item for item in items if item not in readers] + readers
    smoke_process.start()
