"""Core lending between the learner and the rollout workers of its node (common/core_lease.py):
which cores a worker may borrow, and the flag that says when."""

import multiprocessing as mp
import os
import time

import pytest
import torch

from common.core_lease import (
    BUSY,
    IDLE,
    LEARNER,
    MIN_IDLE_S,
    Lease,
    NoLease,
    flag_path,
    remove_flag,
    split_cores,
)


@pytest.mark.parametrize("cores, threads, workers, learner, expect", [
    ([0, 1], 1, 1, 1, [([0], [1])]),                                    # cpu-demo on 2 cores
    ([0, 1], 1, 2, 1, [([0], []), ([1], [])]),                          # no core left over
    (list(range(14)), 1, 4, 10, [([i], list(range(4 + i, 14, 4))) for i in range(4)]),
    (list(range(8)), 2, 2, 2, [([0, 1], [4]), ([2, 3], [5])]),          # learner 2 of 4 free
    ([3, 7], 1, 1, 1, [([3], [7])]),                                    # this process's set
])
def test_each_worker_owns_its_cores_and_borrows_a_share_of_the_learners(
        cores, threads, workers, learner, expect):
    got = [split_cores(cores, threads, i, workers, learner) for i in range(workers)]
    assert got == expect
    lent = [c for _, share in got for c in share]
    assert len(lent) == len(set(lent))  # no core lent twice
    assert not set(lent) & {c for own, _ in got for c in own}


@pytest.fixture
def threads_back():
    n = torch.get_num_threads()
    yield torch._C.set_num_threads
    torch._C.set_num_threads(n)


def settle():
    """Past MIN_IDLE_S: a role that said idle now lends."""
    time.sleep(MIN_IDLE_S * 1.5)


def learner_and_worker(path, set_threads):
    """The learner (slot 0, creates the file) and worker 0 (slot 1), one thread each, each
    lending to the other."""
    learner = Lease(path, LEARNER, 1, {1: 1}, set_threads=set_threads, slots=2)
    worker = Lease(path, 1, 1, {LEARNER: 1}, set_threads=set_threads)
    return learner, worker


def test_a_worker_borrows_only_while_the_learner_says_idle(tmp_path, threads_back):
    path = str(tmp_path / "flags")
    worker = Lease(path, 1, 1, {LEARNER: 1}, set_threads=threads_back)
    worker.before_step()  # no learner here (yet): own cores only
    assert torch.get_num_threads() == 1
    learner = Lease(path, LEARNER, 1, {1: 1}, set_threads=threads_back, slots=2)
    worker.before_step()
    assert torch.get_num_threads() == 1  # idle for less than MIN_IDLE_S: not yet
    settle()
    worker.before_step()
    assert torch.get_num_threads() == 2
    with learner.busy():
        worker.before_step()
        assert torch.get_num_threads() == 1
        assert worker.pick() == 1
    settle()
    worker.before_step()
    assert torch.get_num_threads() == 2
    assert worker.stats() == {"lent_steps": 2, "steps": 5}
    assert worker.stats() == {"lent_steps": 0, "steps": 0}  # since the last call
    learner.close(remove=True)
    assert not os.path.exists(path)
    worker.close()


def test_the_learner_borrows_a_worker_core_only_once_the_worker_said_idle(tmp_path):
    threads = []
    learner, worker = learner_and_worker(str(tmp_path / "flags"), threads.append)
    with learner.busy():
        assert learner.pick() == 1  # the worker joined (idle) just now: not yet
        settle()
        assert learner.pick() == 2  # it waits: its core is free
        with worker.busy():
            assert learner.pick() == 1
            assert worker.pick() == 1  # the learner is busy too
        assert learner.pick() == 1  # the worker just ended a call: its next may be queued
        settle()
        assert learner.pick() == 2
    settle()
    assert worker.pick() == 2       # and the learner's, once it waits
    worker.close()                  # a worker that leaves lends nothing
    assert learner.pick() == 1
    assert threads == [1, 1, 2, 1, 2, 2, 1]  # every change went through set_threads, once
    assert learner.state(1)[0] not in (BUSY, IDLE)


def test_a_role_with_nothing_to_borrow_never_changes_its_threads(tmp_path, threads_back):
    path = str(tmp_path / "flags")
    learner = Lease(path, LEARNER, 1, {}, set_threads=threads_back, slots=2)
    worker = Lease(path, 1, 1, {}, set_threads=threads_back)
    worker.before_step()
    assert torch.get_num_threads() == 1 and worker.stats()["lent_steps"] == 0
    assert learner.pick() == 1
    learner.close(remove=True)


def _die_busy(path: str) -> None:
    update = Lease(path, LEARNER, 1, {}, set_threads=lambda n: None, slots=2).busy()
    update.__enter__()
    os._exit(0)  # killed mid-update: the flag stays set


def test_a_replaced_learner_clears_the_flag_a_dead_one_left_set(tmp_path):
    """The replacement opens the same file in place, so a worker's existing mapping sees it;
    the workers' slots are kept."""
    path = str(tmp_path / "flags")
    learner, worker = learner_and_worker(path, lambda n: None)
    with worker.busy():
        pass
    settle()
    assert worker.pick() == 2
    proc = mp.get_context("spawn").Process(target=_die_busy, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert worker.pick() == 1  # another process's busy flag reaches this mapping
    replacement = Lease(path, LEARNER, 1, {1: 1}, set_threads=lambda n: None, slots=2)
    settle()
    assert worker.pick() == 2
    assert replacement.pick() == 2  # worker 0 still reads idle
    worker.close()


def test_the_flag_file_of_a_run_is_removed_at_the_end(tmp_path):
    key = f"test{os.getpid()}"
    Lease(flag_path(key), LEARNER, 1, {}, set_threads=lambda n: None, slots=2).close()
    assert os.path.exists(flag_path(key))
    remove_flag(key)
    assert not os.path.exists(flag_path(key))
    remove_flag(key)     # already gone: no error
    remove_flag(None)    # outside a Ray job: nothing to do


def test_no_lease_answers_every_call_a_lease_does_and_never_lends(tmp_path):
    """A role that shares nothing (GPU, share_cores off) holds a NoLease: the learner and the
    vLLM worker call it exactly as a Lease, with no None checks."""
    public = {n for n in vars(Lease) if not n.startswith("_") and callable(getattr(Lease, n))}
    assert public - {"state", "lends"} <= set(vars(NoLease))  # what roles call on their lease
    calls = []
    real = Lease(str(tmp_path / "flags"), LEARNER, 1, {}, set_threads=calls.append, slots=1)
    for lease in (real, NoLease()):
        with lease.busy():
            lease.before_step()
        assert set(lease.stats()) == {"lent_steps", "steps"}
        lease.close(remove=True)
    assert NoLease().stats() == {"lent_steps": 0, "steps": 0}
    assert NoLease().pick() == 0  # borrows nothing, sets no thread count
