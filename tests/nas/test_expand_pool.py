"""Start-up children expanded in other processes: the same children, in the same order; a broken pool loses nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from layer_flops import conv_dense_train_flops

from nas.expand_pool import ExpandPool
from nas.limits import Limits
from nas.search import SearchSettings, make_proposer
from nas.startup import Expanded, Packed, StartupChildren
from nas.zoo import small_resnet

SEED = small_resnet(input_shape=(16, 16, 1))
LIMITS = Limits(max_layers=16, max_params=200_000, max_flops_per_image=1e8, flops_fn=conv_dense_train_flops)


def _key(item: Expanded | Packed) -> str:
    return item.key if isinstance(item, Packed) else item.graph.key()


def _children(expander, count: int, seed: int = 4, before=None) -> list[tuple[str, tuple]]:
    startup = StartupChildren(SEED, seed, 3, LIMITS, LIMITS.admits, 3, expander)
    out = []
    for k in range(count):
        if before is not None:
            before(k, startup)
        grown = startup.next(lambda key: False)
        if grown is None:
            break
        out.append((grown[0].key(), grown[1]))
    return out


@pytest.fixture(scope="module")
def inline_children():
    return _children(None, 1500)


@pytest.mark.parametrize("processes", [1, 2])
def test_children_from_processes_are_those_expanded_here_in_the_same_order(inline_children, processes):
    pool = ExpandPool(processes, LIMITS)
    try:
        assert _children(pool, 1500) == inline_children
    finally:
        pool.close()
    assert len({key for key, _ in inline_children}) == len(inline_children) == 1500
    assert {len(path) for _, path in inline_children} >= {1, 2}  # the tree is walked past its first level
    assert _children(None, 200, seed=5) != inline_children[:200]  # the run's seed orders the walk


def test_while_a_process_is_behind_the_master_expands_nodes_itself_and_the_walk_is_the_same(inline_children):
    from expand_work import slow_expand_unsent

    # The master hands out every start-up child of a node in about a millisecond; a node takes the
    # process a quarter of a second more, so the master must not wait: it expands the queued nodes
    # the process has not been given, and the process's share is what it managed meanwhile.
    pool = ExpandPool(1, LIMITS, work=slow_expand_unsent)
    startup = StartupChildren(SEED, 4, 3, LIMITS, LIMITS.admits, 3, pool)
    try:
        out = []
        for _ in range(1500):
            grown = startup.next(lambda key: False)
            assert grown is not None
            out.append((grown[0].key(), grown[1]))
    finally:
        pool.close()
    assert out == inline_children
    assert startup.expanded_here > 0, "the master waited for the process instead of expanding"
    from nas.startup import _Done

    still_queued = sum(isinstance(expansion, _Done) for _, _, expansion in startup._queue)
    assert startup.nodes_taken > startup.expanded_here - still_queued, "every node taken was the master's"


def test_a_pool_whose_processes_are_killed_hands_over_to_this_process_without_a_gap(inline_children, caplog):
    pool = ExpandPool(2, LIMITS)

    def kill_at_300(k, startup):
        if k == 300:
            for proc in pool._procs:
                with contextlib.suppress(ProcessLookupError):  # the pool ends the others once one dies
                    os.kill(proc.process.pid, signal.SIGKILL)
                proc.process.join(10)

    try:
        assert _children(pool, 1500, before=kill_at_300) == inline_children
    finally:
        pool.close()
    assert "expanding here instead" in caplog.text


def test_closing_the_pool_mid_start_up_keeps_the_walk(inline_children):
    search_pool = ExpandPool(1, LIMITS)

    def close_at_400(k, startup):
        if k == 400:
            startup.expand_here()
            search_pool.close()

    assert _children(search_pool, 1500, before=close_at_400) == inline_children
    with pytest.raises(RuntimeError, match="closed"):
        search_pool.start(SEED, 3, 4, LIMITS)


@pytest.mark.parametrize("processes", [0, -1, 257, True, 2.0])
def test_a_pool_size_out_of_range_is_refused(processes):
    with pytest.raises(ValueError, match="expansion processes"):
        ExpandPool(processes, LIMITS)


def _search_keys(processes: int, asks: int = 600, batch: int = 1, kill_at: int | None = None):
    """Proposals of a search whose results start after 400 asks (the start-up, then the tree search's steady state)."""
    settings = SearchSettings(seed=2, candidates=16, landmarks=12, processes=processes, batch=batch, tune_ahead=4)
    search = make_proposer(settings, SEED, LIMITS)
    keys, tree = [], 0
    for k in range(asks):
        if k == kill_at:
            for proc in search._expander._procs:  # type: ignore[attr-defined]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.process.pid, signal.SIGKILL)
                proc.process.join(10)
        proposal = search.ask(f"t{k}")
        keys.append(proposal.graph.key())
        tree += proposal.info.get("strategy") == "bayesian"
        if k >= 400:
            search.tell(f"t{k - 400}", 0.3 + 0.6 * ((k * 7919) % 101) / 101, True)
    return search, keys, tree


@pytest.fixture(scope="module")
def search_inline():
    search, keys, tree = _search_keys(0)
    search.close()
    assert tree > 50, "the steady state's tree search proposed most of the last asks"
    return keys


@pytest.mark.parametrize("batch", [1, 8])
def test_a_search_with_expansion_processes_proposes_what_one_without_does_and_closes_them(search_inline, batch):
    search, keys, _ = _search_keys(2, batch=batch)
    pool = search._expander  # type: ignore[attr-defined]
    try:
        # The start-up's processes went on with the tree search's expansions: their counts reached the master.
        assert pool is not None and search._grower.active  # type: ignore[attr-defined]
        assert all(proc.process.is_alive() for proc in pool._procs)
        assert search.tuner.in_process  # TPE in a process of its own, asked four ahead as without one
        tuner_process = search.tuner._process
        learned = [key for key in keys[400:] if key in search.limits._flops]
        assert len(learned) > 50
    finally:
        search.close()
    assert not any(proc.process.is_alive() for proc in pool._procs) and not tuner_process.is_alive()
    if batch == 1:
        assert keys == search_inline
    else:  # a batch picks from the same candidates, so it proposes other children, but the same whatever the processes
        assert keys[:400] == search_inline[:400] and keys != search_inline
        inline, inline_keys, _ = _search_keys(0, batch=batch)
        inline.close()
        assert keys == inline_keys


def test_tree_search_processes_killed_mid_run_hand_over_to_the_master_with_the_same_proposals(search_inline, caplog):
    search, keys, _ = _search_keys(2, kill_at=500)
    search.close()
    assert keys == search_inline
    assert "expanding in the master instead" in caplog.text


def test_a_resumed_search_starts_its_tree_search_processes_without_a_start_up(search_inline):
    search, keys, _ = _search_keys(0, asks=450)
    # What a resume gives a fresh search: every proposal and result so far, then the same asks.
    settings = SearchSettings(seed=2, candidates=16, landmarks=12, processes=2)
    resumed = make_proposer(settings, SEED, LIMITS)
    for k in range(450):
        trial = search.book.trials[f"t{k}"]  # type: ignore[attr-defined]
        value = trial.value
        resumed.restore(f"t{k}", trial.proposal, value, value is not None)
    try:
        asked = [resumed.ask(f"t{k}") for k in range(450, 470)]
        assert resumed._expander is not None and resumed._grower.active  # type: ignore[attr-defined]
    finally:
        resumed.close()
    search.close()
    grown = [p.graph.key() for p in asked if p.info.get("strategy") == "bayesian"]
    assert len(grown) >= 10 and len(set(grown)) == len(grown) and not set(grown) & set(keys)


def test_a_machine_without_a_process_pool_expands_in_the_master(monkeypatch, caplog):
    import nas.search

    def unavailable(*args, **kwargs):
        raise OSError("no /dev/shm")

    monkeypatch.setattr(nas.search, "ExpandPool", unavailable)
    settings = SearchSettings(seed=2, candidates=16, landmarks=12, processes=4)
    search = make_proposer(settings, SEED, LIMITS)
    keys = [search.ask(f"t{k}").graph.key() for k in range(300)]
    inline = make_proposer(SearchSettings(seed=2, candidates=16, landmarks=12), SEED, LIMITS)
    assert keys == [inline.ask(f"t{k}").graph.key() for k in range(300)]
    assert "expanding in the master" in caplog.text


@pytest.mark.parametrize("delay_s", [0.05, 0.2, 0.4])
def test_a_process_killed_while_sending_its_result_fails_the_expansion_at_once(tmp_path, monkeypatch, delay_s):
    # concurrent.futures.ProcessPoolExecutor never resolves this future when the kill lands while
    # the result is on its way (sending 300 MB takes about 0.3 s on the development VM; the delays
    # after the process says it is about to send spread the kill over that window): its processes
    # share one result pipe, and its reader waits for the rest of a message that never comes.
    from expand_work import RESULT_BYTES, large_result_after_a_mark

    from nas.expand_pool import PoolBroken

    mark = tmp_path / "mark"
    monkeypatch.setenv("AIPERF_TEST_EXPAND_MARK", str(mark))  # the spawned process inherits it
    pool = ExpandPool(2, LIMITS, patience_s=60, work=large_result_after_a_mark)
    try:
        expansion = pool.start(SEED, 3, 4, LIMITS)
        for _ in range(600):
            if mark.exists():
                break
            time.sleep(0.05)
        assert mark.exists(), "the expansion process never ran its work"
        time.sleep(delay_s)
        for proc in pool._procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.process.pid, signal.SIGKILL)
        began = time.monotonic()
        try:
            assert len(expansion.result()) == RESULT_BYTES  # all sent before the kill: also no hang
        except PoolBroken as exc:
            assert "an expansion process ended" in str(exc)
        assert time.monotonic() - began < 30  # not the patience: the death is seen on the pipe
        with pytest.raises(PoolBroken):  # the pool takes no more work
            pool.start(SEED, 3, 4, LIMITS).result()
    finally:
        pool.close()


def test_a_stopped_process_is_waited_for_its_patience_then_the_start_up_goes_on_here(inline_children, caplog):
    pool = ExpandPool(2, LIMITS, patience_s=2)

    def stop_at_300(k, startup):
        if k == 300:
            for proc in pool._procs:
                # On a loaded box the patience may already have run out (the start-up went on here, the
                # processes were ended): the outcome under test is the same.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.process.pid, signal.SIGSTOP)

    try:
        assert _children(pool, 1500, before=stop_at_300) == inline_children
    finally:
        pool.close()  # a stopped process is killed too: close returns
    assert "expanding here instead" in caplog.text
    assert all(proc.process.exitcode is not None for proc in pool._procs)


def test_a_process_sends_each_child_once_and_leaves_none_out():
    from nas.startup import expand

    nodes = [SEED] + [item.graph for item in expand(SEED, 3, 4, None)[:6]]
    pool = ExpandPool(1, LIMITS)
    try:
        expansions = [pool.start(node, 3, 4, LIMITS) for node in nodes]  # queued in order, like the start-up
        sent = [_key(item) for expansion in expansions for item in expansion.result()]
    finally:
        pool.close()
    here = [item.graph.key() for node in nodes for item in expand(node, 3, 4, None)]
    assert len(sent) == len(set(sent))  # a repeat is not sent again
    assert set(sent) == set(here)  # and nothing else is left out
    assert len(sent) < len(here)  # (the siblings' children do repeat one another)


def test_children_refused_at_the_ceiling_travel_packed_and_the_walk_is_the_same_when_it_rises(monkeypatch):
    # A ceiling just above the seed refuses most children (their FLOPs grow); it rises past them all
    # at child 150, so children packed by the processes before that must be unpacked and handed out.
    step = {"k": 0}
    low = LIMITS.flops(SEED) * 1.02

    def ceiling() -> float:
        return low if step["k"] < 150 else float("inf")

    def accept(graph) -> bool:
        return LIMITS.admits(graph) and LIMITS.flops(graph) <= ceiling()

    def walk(expander) -> list[tuple[str, tuple]]:
        step["k"] = 0
        startup = StartupChildren(SEED, 4, 3, LIMITS, accept, 3, expander, ceiling)
        out = []
        for step["k"] in range(400):
            grown = startup.next(lambda key: False)
            if grown is None:
                break
            out.append((grown[0].key(), grown[1]))
        return out

    counts = {"refused": 0, "unpacked": 0}
    refused, unpack = Packed.refused, Packed.unpack

    def counting_refused(self, at):
        answer = refused(self, at)
        counts["refused"] += answer
        return answer

    def counting_unpack(self):
        counts["unpacked"] += 1
        return unpack(self)

    monkeypatch.setattr(Packed, "refused", counting_refused)
    monkeypatch.setattr(Packed, "unpack", counting_unpack)
    here = walk(None)
    assert counts == {"refused": 0, "unpacked": 0}  # nothing is packed in this process
    pool = ExpandPool(2, LIMITS)
    try:
        assert walk(pool) == here
    finally:
        pool.close()
    assert counts["refused"] > 50 and counts["unpacked"] > 50  # both paths were taken
    assert len(here) == 400 and len({key for key, _ in here}) == 400


def test_a_packed_child_is_the_child_and_the_limits_verdict_decides_before_the_ceiling():
    from nas.expand_pool import expand_unsent
    from nas.startup import expand

    ceiling = sorted(item.flops for item in expand(SEED, 3, 7, LIMITS))[20]
    items = expand_unsent(SEED, 3, 7, LIMITS, ceiling)  # the children at most ``ceiling`` and within the limits whole
    packed = [item for item in items if isinstance(item, Packed)]
    whole = [item for item in items if isinstance(item, Expanded)]
    assert len(packed) > 10 and len(whole) > 10
    assert all(item.flops <= ceiling and not item.verdict for item in whole)
    for item in packed:
        child = item.unpack()
        assert child.graph.key() == item.key and child.verdict == item.verdict and child.flops == item.flops
        assert item.refused(ceiling)
        assert item.refused(float("inf")) == bool(item.verdict)


def test_one_expansion_process_ends_with_the_start_up_and_the_tree_search_stays_here(search_inline):
    # One process cannot shorten a round the master waits for (nas.search.MIN_TREE_PROCESSES); TPE keeps its own.
    search, keys, _ = _search_keys(1)
    try:
        assert search._expander is None and search._grower is None  # type: ignore[attr-defined]
        assert search.tuner.in_process
    finally:
        search.close()
    assert keys == search_inline


def test_a_child_from_a_process_shares_the_layers_it_left_unchanged_with_its_parent():
    import pickle

    from nas.tree_expand import GrowTask, grow, share_nodes

    growth = grow(GrowTask(SEED, 3, 7, 0, 6), LIMITS.admits_structure, {})
    assert len(growth.children) == 6
    for built in growth.children:
        child = pickle.loads(pickle.dumps(built.graph))  # as it comes from a process: copies of every layer
        key, nodes = child.key(), child.nodes
        assert not any(a is b for a in child.nodes for b in SEED.nodes)
        share_nodes(child, SEED)
        parent = {n.id: n for n in SEED.nodes}
        kept = [n for n in child.nodes if n.id in parent and n == parent[n.id]]
        assert len(kept) >= len(SEED.nodes) - 3 and all(n is parent[n.id] for n in kept)
        assert child.nodes == nodes and child.key() == key  # the same graph
        assert [n is parent.get(n.id) for n in child.nodes] == [n in kept for n in child.nodes]
