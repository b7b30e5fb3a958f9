"""The suite's own sharing of the cores (tests/cores.py): an exclusive test waits for the
shared ones running, and shared ones asked for after it wait for it instead of starving it."""

from __future__ import annotations

import threading
import time

from tests.cores import group_of, holding_cores


def _hold(directory, name, exclusive, seconds, log, started=None):
    with holding_cores(directory, exclusive=exclusive):
        log.append(("in", name, time.monotonic()))
        if started:
            started.set()
        time.sleep(seconds)
        log.append(("out", name, time.monotonic()))


def test_an_exclusive_test_waits_for_the_shared_one_and_is_not_overtaken(tmp_path):
    log: list = []
    first_in = threading.Event()
    shared = threading.Thread(target=_hold, args=(tmp_path, "shared-1", False, 0.6, log,
                                                  first_in))
    shared.start()
    first_in.wait(5)
    alone = threading.Thread(target=_hold, args=(tmp_path, "alone", True, 0.4, log))
    alone.start()
    time.sleep(0.2)  # "alone" now waits for shared-1
    late = threading.Thread(target=_hold, args=(tmp_path, "shared-2", False, 0.1, log))
    late.start()
    for t in (shared, alone, late):
        t.join(10)
    order = [(event, name) for event, name, _ in sorted(log, key=lambda e: e[2])]
    assert order == [("in", "shared-1"), ("out", "shared-1"), ("in", "alone"),
                     ("out", "alone"), ("in", "shared-2"), ("out", "shared-2")], order


def test_shared_tests_run_side_by_side(tmp_path):
    log: list = []
    both = [threading.Thread(target=_hold, args=(tmp_path, f"s{i}", False, 0.5, log))
            for i in range(2)]
    t0 = time.monotonic()
    for t in both:
        t.start()
    for t in both:
        t.join(10)
    entered = sorted(at for event, _, at in log if event == "in")
    assert entered[1] - t0 < 0.4, log  # the second did not wait for the first to finish


def test_groups_keep_session_fixtures_on_one_worker():
    assert group_of("tests/train/test_fp8.py::test_x") == "tests/train"
    assert group_of("tests/train/test_resume.py::test_y[a]") == "tests/train"
    assert group_of("tests/planner/test_cli.py::test_z") == "tests/planner/test_cli.py"
    assert group_of("tests/test_demo.py::test_demo") == "tests/test_demo.py"
