"""The learned job history (rm/sched/history.py): groups by what predicts a job's size, the most specific group with
enough history answering, Gittins tables per group, run-time estimates. Pure: records in, answers out."""

from __future__ import annotations

import pytest

from gpurm.rm.sched import gittins
from gpurm.rm.sched.history import Features, Finished, History, gpu_class, group_keys


def test_gpu_classes_are_the_reports_classes() -> None:
    assert [gpu_class(g) for g in (0.5, 1, 2, 4, 5, 8, 9, 16, 17, 64)] == \
        ["share", "1", "2-4", "2-4", "5-8", "5-8", "9-16", "9-16", "17+", "17+"]


def test_groups_go_from_the_most_specific_to_the_whole_cluster() -> None:
    f = Features(queue="root.nlp", user="ann", name="bert", gpus=8)
    assert group_keys(f, "full") == (("user,name", "ann", "bert"), ("queue,gpus", "root.nlp", "5-8"),
                                     ("gpus", "5-8"), ("",))
    assert group_keys(f, "none") == (("",),)


def test_unknown_conditioning_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="conditioning: must be one of none, gpus, queue, full"):
        History("by-moon-phase")


def test_a_group_answers_only_once_it_has_enough_jobs_and_the_whole_cluster_answers_before() -> None:
    h = History(min_group=10, min_finished=5)
    mine = Features(queue="q", user="ann", name="short", gpus=1)
    for _ in range(5):
        h.finished(Finished("q", "bob", "long", 1, 10_000.0))
    # Ann has no history yet: the cluster's (bob's long jobs) speaks for her.
    assert h.remaining_s(mine, 0.0) == pytest.approx(10_000.0)
    for _ in range(10):
        h.finished(Finished("q", "ann", "short", 1, 100.0))
    # Now her own group (user, name) has 10 jobs: it answers.
    assert h.remaining_s(mine, 0.0) == pytest.approx(100.0)
    # Bob's group has 5 < 10: his queue-and-GPUs group (15 jobs, both users) answers for him.
    bob = Features(queue="q", user="bob", name="long", gpus=1)
    assert h.remaining_s(bob, 0.0) == pytest.approx((5 * 10_000 + 10 * 100) / 15)


def test_remaining_is_conditioned_on_what_the_job_has_run() -> None:
    h = History(conditioning="none", min_finished=4)
    for d in (100.0, 200.0, 1000.0, 5000.0):
        h.finished(Finished(gpus=2, size_gpu_s=2 * d))
    f = Features(gpus=2)
    assert h.remaining_s(f, 0.0) == pytest.approx((100 + 200 + 1000 + 5000) / 4)
    assert h.remaining_s(f, 150.0) == pytest.approx((200 + 1000 + 5000) / 3 - 150)
    assert h.remaining_s(f, 150.0, quantile=0.0) == pytest.approx(50.0)     # the shortest still possible
    assert h.remaining_s(f, 150.0, quantile=0.99) == pytest.approx(4850.0)
    # Past every job seen: as long again as it has run.
    assert h.remaining_s(f, 9000.0) == pytest.approx(9000.0)


def test_with_no_history_at_all_a_job_is_expected_to_run_an_hour_or_as_long_again() -> None:
    h = History()
    assert h.remaining_s(Features(), 0.0) == 3600.0
    assert h.remaining_s(Features(), 7200.0) == 7200.0
    assert not h.ready and h.index(Features(), 0.0) == 0.0


def test_gittins_tables_per_group_rank_a_job_by_its_own_groups_sizes() -> None:
    h = History(conditioning="gpus", min_group=20, min_finished=20)
    for _ in range(20):
        h.finished(Finished(gpus=1, size_gpu_s=100.0))       # one-GPU jobs: all short
    for _ in range(20):
        h.finished(Finished(gpus=8, size_gpu_s=80_000.0))    # eight-GPU jobs: all long
    assert h.ready
    one, eight = Features(gpus=1), Features(gpus=8)
    # A fresh one-GPU job is very likely to finish soon; a fresh eight-GPU job is not.
    assert h.index(one, 0.0) > h.index(eight, 0.0) > 0
    # Each group's table is the plain Gittins table of its own sizes.
    assert h.index(one, 0.0) == gittins.index_table([100.0] * 20)[0]


def test_version_moves_when_a_table_is_rebuilt_and_only_then() -> None:
    h = History(conditioning="none", min_finished=10)
    versions = []
    for i in range(30):
        whole = h.finished(Finished(size_gpu_s=float(100 + i)))
        versions.append(h.version)
        assert whole == (versions[-1] != (versions[-2] if i else 0))     # one group: it is the whole cluster's
    rebuilt_at = [i + 1 for i in range(30) if versions[i] != (versions[i - 1] if i else 0)]
    # Built at 10 jobs; then again whenever the count grew by 10% of the last build (at least one job).
    assert rebuilt_at == [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 24, 26, 28, 30]


def test_finished_says_whether_the_whole_clusters_table_was_rebuilt_and_version_counts_every_group() -> None:
    h = History(conditioning="gpus", min_group=2, min_finished=4)
    assert not h.finished(Finished(gpus=8, size_gpu_s=1.0))
    v = h.version
    assert not h.finished(Finished(gpus=8, size_gpu_s=1.0))     # the 8-GPU group's table is built, not the cluster's
    assert h.version == v + 1
    assert not h.finished(Finished(gpus=1, size_gpu_s=1.0))
    assert h.finished(Finished(gpus=1, size_gpu_s=1.0))         # 4 jobs: the cluster's table too
