"""Core lending between the learner and the rollout workers of its node (common/core_lease.py):
which cores a worker may borrow, and the flag that says when."""

import multiprocessing as mp
import os

import pytest
import torch

from common.core_lease import Borrower, LearnerFlag, flag_path, remove_flag, split_cores


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


def test_a_worker_borrows_only_while_the_learner_flag_says_idle(tmp_path, threads_back):
    path = str(tmp_path / "flag")
    b = Borrower(path, own=1, lent=1, set_threads=threads_back)
    b.before_step()  # no learner here (yet): own cores only
    assert torch.get_num_threads() == 1
    flag = LearnerFlag(path)
    b.before_step()
    assert torch.get_num_threads() == 2
    with flag.busy():
        b.before_step()
        assert torch.get_num_threads() == 1
        assert b.pick() == 1  # a weight load beside the update: own cores
    b.before_step()
    assert torch.get_num_threads() == 2
    assert b.stats() == {"lent_steps": 2, "steps": 4}
    assert b.stats() == {"lent_steps": 0, "steps": 0}  # since the last call
    flag.close()
    assert not os.path.exists(path)
    b.close()


def test_a_worker_with_nothing_to_borrow_never_changes_its_threads(tmp_path, threads_back):
    path = str(tmp_path / "flag")
    flag = LearnerFlag(path)
    threads_back(1)
    b = Borrower(path, own=1, lent=0, set_threads=threads_back)
    b.before_step()
    assert torch.get_num_threads() == 1 and b.stats()["lent_steps"] == 0
    flag.close()


def _die_busy(path: str) -> None:
    update = LearnerFlag(path).busy()
    update.__enter__()
    os._exit(0)  # killed mid-update: the flag stays set


def test_a_replaced_learner_clears_the_flag_a_dead_one_left_set(tmp_path, threads_back):
    """The replacement opens the same file in place, so a worker's existing mapping sees it."""
    path = str(tmp_path / "flag")
    LearnerFlag(path)
    b = Borrower(path, own=1, lent=1, set_threads=threads_back)
    assert b.pick() == 2
    proc = mp.get_context("spawn").Process(target=_die_busy, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert b.pick() == 1  # another process's busy flag reaches this mapping
    LearnerFlag(path)     # the replacement learner
    assert b.pick() == 2
    b.close()


def test_the_flag_of_a_job_is_removed_at_the_end(tmp_path):
    job = f"test{os.getpid()}"
    LearnerFlag(flag_path(job)).close(remove=False)
    assert os.path.exists(flag_path(job))
    remove_flag(job)
    assert not os.path.exists(flag_path(job))
    remove_flag(job)     # already gone: no error
    remove_flag(None)    # outside a Ray job: nothing to do
