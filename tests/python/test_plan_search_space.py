"""Issue 18: the planner's defaults scale — node counts beyond 8 nodes, no micro-batch cap, the exact
memory bound on (micro-batches, replicas) pairs and the branch and bound over them — and lose nothing
against the wide search (every node count, every pair) on the same cost model."""
import re
import time

import weft


def _count(text, pattern):
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return int(m.group(1))


def test_defaults_equal_the_wide_search_on_a_mid_size_case():
    # 12 nodes (beyond 8: the node-count rule applies) and a memory limit that binds (memory-limited
    # SPMD searches, the expensive ones, are needed): the default search space against every node
    # count and every (micro-batches, replicas) pair, same cost model.
    g = weft.models.gpt(layers=8, hidden=1024, heads=16, seq=512, vocab=8192, batch=96).train_step(optimizer="adam")
    c = weft.Cluster.preset("M8", nodes=12)
    t0 = time.perf_counter()
    default = weft.plan(g, c, memory_limit=3e8)
    t1 = time.perf_counter()
    wide = weft.plan(g, c, memory_limit=3e8, all_node_counts=True, bound_search=False)
    t2 = time.perf_counter()
    assert default.step_time <= wide.step_time * 1.01, (default.summary(), wide.summary())
    assert default.peak_memory <= 3e8 * 0.9 * 1.000001
    # The rules are reported, and they narrowed this search.
    assert "node counts that are powers of two or divide 12" in default.search_space
    assert _count(default.search_space, r"(\d+) of them skipped") > 0
    assert _count(wide.search_space, r"(\d+) of them skipped") == 0
    assert _count(default.search_space, r"(\d+) submeshes") < _count(wide.search_space, r"(\d+) submeshes")
    print(f"default {t1 - t0:.1f} s, wide {t2 - t1:.1f} s, step {default.step_time:.5f} vs {wide.step_time:.5f}")


def test_microbatch_counts_are_not_capped_and_hopeless_pairs_are_left_out():
    # batch 256 on one 8-GPU node: the best pipeline wants many micro-batches (no hidden cap of 32), and
    # the pairs whose replica cannot hold state + one micro-batch of activations are left out.
    # Without recomputation (recompute="none") and with replicated states (zero=0): every activation
    # and a whole state per replica kept, as this bound assumes.
    g = weft.models.gpt(layers=4, hidden=512, heads=8, seq=256, vocab=4096, batch=256).train_step(optimizer="adam")
    c = weft.Cluster.preset("M8", nodes=1)
    p = weft.plan(g, c, memory_limit=2e9, recompute="none", zero=0)
    assert "micro-batches 1,2,...,256 (9 counts)" in p.search_space
    capped = weft.plan(g, c, memory_limit=2e9, max_microbatches=32, recompute="none", zero=0)
    assert "<= 32" in capped.search_space
    assert p.step_time <= capped.step_time * (1 + 1e-9)
    left_out = _count(p.search_space, r"(\d+) left out by the memory bound")
    assert left_out > 0
    # Both bounds are safe here: without them (bound_search=False: every pair searched, none left
    # out), each micro-batch count planned alone, the best plan is the same.
    best = None
    for m in (2 ** k for k in range(9)):
        try:
            q = weft.plan(g, c, memory_limit=2e9, num_microbatches=m, bound_search=False, recompute="none", zero=0)
        except ValueError:
            continue
        best = q if best is None or q.step_time < best.step_time else best
    assert best is not None and abs(best.step_time - p.step_time) <= 1e-9 * p.step_time
    # With recompute="auto" and zero="auto" (the defaults) the bound counts what a full recomputation
    # keeps (each block's inputs) and the state ZeRO-3 keeps over the replicas, so it leaves out no more
    # pairs, and the plan is no slower than without.
    auto = weft.plan(g, c, memory_limit=2e9)
    assert _count(auto.search_space, r"(\d+) left out by the memory bound") <= left_out
    assert auto.step_time <= p.step_time * (1 + 1e-9)
