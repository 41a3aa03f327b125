"""weft.pipeline: layer grouping (brute force over cuts), stage extraction, submeshes, the stage DP
against enumeration, the stage ILP against enumeration and the best linear cut, errors."""
import itertools
import random

import pytest

import weft
import weft.pipeline as wp


def tiny_gpt(layers=2):
    return weft.models.gpt(layers=layers, hidden=4, heads=2, seq=3, vocab=5, batch=2).train_step()


def test_group_layers_covers_ops_and_minimises_max():
    g = tiny_gpt(2)
    for k in (1, 2, 3):
        lg = wp.group_layers(g, k)
        assert len(lg) == k
        ops = sorted(o for b in lg.blocks for o in b.ops)
        assert ops == list(range(len(g.ops)))
        assert [o for b in lg.blocks for o in b.forward_ops] == list(lg.forward_order)
        total = sum(b.forward_flops + b.backward_flops + b.update_flops for b in lg.blocks)
        assert total == pytest.approx(g.forward_flops())
        assert sum(b.param_bytes for b in lg.blocks) == g.param_bytes()
        assert lg.cut_bytes == sum(lg.crossing_bytes)
    # Brute force over the cut positions for 2 blocks: the max block compute is minimal.
    lg = wp.group_layers(g, 2)
    owner = wp.owner_forward_op(g)
    phase = wp.classify_ops(g)
    order = list(lg.forward_order)
    pos = {o: i for i, o in enumerate(order)}
    flops = [op["flops"] for op in g.ops]
    best = min(
        max(sum(f for o, f in enumerate(flops) if phase[o] != wp.OpPhase.Update and (pos[owner[o]] < c) == side)
            for side in (True, False))
        for c in range(1, len(order)))
    assert lg.max_block_flops == pytest.approx(best)
    with pytest.raises(ValueError):
        wp.group_layers(g, 0)


def test_extract_stage_is_a_valid_graph():
    g = tiny_gpt(2)
    lg = wp.group_layers(g, 2)
    for b in range(2):
        s = wp.extract_stage(g, lg.ops_of_range(b, b))
        s.validate()
        assert len(s.ops) == len(lg.blocks[b].ops)
    st, tmap, omap = wp.extract_stage_mapped(g, lg.ops_of_range(1, 1))
    assert st.loss is not None and tmap[st.loss] == g.loss
    assert sorted(omap) == sorted(lg.blocks[1].ops)
    with pytest.raises(ValueError):
        wp.extract_stage(g, [])
    # Two middle GPT layers cut out by name are the same structure (one SPMD solve serves both).
    g3 = tiny_gpt(4)  # h1, h2 are middle layers (the last one feeds the final LN only)
    owner = wp.owner_forward_op(g3)
    names = [op["name"] for op in g3.ops]
    layer = {p: [o for o in range(len(names)) if names[owner[o]].startswith(p)] for p in ("h1.", "h2.")}
    a, b = (wp.extract_stage(g3, layer[p]) for p in ("h1.", "h2."))
    assert wp.structurally_equal(a, b) and wp.structural_hash(a) == wp.structural_hash(b)
    assert not wp.structurally_equal(a, s)


def test_submeshes_and_placement():
    c = weft.Cluster.preset("M8", 2)
    shapes = wp.submesh_shapes(c)
    assert [(s.nodes, s.devices_per_node) for s in shapes] == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]
    assert [tuple(x) for x in wp.logical_mesh_shapes(wp.SubmeshShape(2, 8))] == [(1, 16), (2, 8), (4, 4), (8, 2),
                                                                                 (16, 1)]
    pl = wp.assign_submeshes(c, [wp.SubmeshShape(1, 4), wp.SubmeshShape(1, 8), wp.SubmeshShape(1, 4)])
    ids = [d for p in pl for d in p.device_ids]
    assert sorted(ids) == list(range(16))
    assert pl[1].mesh([2, 4]).shape == [2, 4]
    rep = wp.replicate_pipeline(c, [wp.SubmeshShape(1, 2), wp.SubmeshShape(1, 2)])
    assert rep.replicas == 4
    with pytest.raises(ValueError):
        wp.assign_submeshes(c, [wp.SubmeshShape(1, 8)])


def brute_dp(L, subs, D, cost, B):
    best = float("inf")
    for k in range(L):
        for cuts in itertools.combinations(range(1, L), k):
            bounds = [0, *cuts, L]
            runs = [(bounds[i], bounds[i + 1] - 1) for i in range(len(bounds) - 1)]
            for ms in itertools.product(range(len(subs)), repeat=len(runs)):
                if sum(subs[m].num_devices for m in ms) != D:
                    continue
                ts = [cost(i, j, m) for (i, j), m in zip(runs, ms)]
                if any(t is None for t in ts):
                    continue
                best = min(best, sum(ts) + (B - 1) * max(ts))
    return best


def test_partition_dp_matches_brute_force():
    rng = random.Random(3)
    subs = [wp.SubmeshShape(1, 1), wp.SubmeshShape(1, 2), wp.SubmeshShape(2, 2)]
    checked = 0
    for _ in range(40):
        L = rng.randint(1, 5)
        B = rng.choice([1, 3, 8])
        table = {(i, j, m): (None if rng.random() < 0.1 else round(rng.uniform(0.1, 5), 2))
                 for i in range(L) for j in range(i, L) for m in range(3)}
        calls = []

        def cost(i, j, m):
            calls.append((i, j, m))
            return table[(i, j, m)]

        want = brute_dp(L, subs, 4, lambda i, j, m: table[(i, j, m)], B)
        if want == float("inf"):
            with pytest.raises(ValueError):
                wp.partition_dp(L, subs, cost, num_microbatches=B, total_devices=4)
            continue
        p = wp.partition_dp(L, subs, cost, num_microbatches=B, total_devices=4)
        assert p.latency_s == pytest.approx(want)
        assert len(calls) == len(set(calls)) == L * (L + 1) // 2 * 3
        scan = wp.partition_dp(L, subs, cost, num_microbatches=B, total_devices=4, branch_and_bound=False)
        assert scan.latency_s == pytest.approx(want)
        assert sum(subs[s.submesh_index].num_devices for s in p.stages) == 4
        checked += 1
    assert checked > 10


def test_partition_dp_equal_stages_and_cost_forms():
    c = weft.Cluster.preset("M8", 1)
    # Only 1x2 slices usable (others infeasible): 8 identical layers on 4 equal meshes -> 2 each.
    subs = wp.submesh_shapes(c)

    def cost(i, j, m):
        if subs[m].num_devices != 2:
            return None
        return wp.StageCost(float(j - i + 1), 1e9, True)

    p = wp.partition_dp(8, c, cost, num_microbatches=4)
    assert [s.last_block - s.first_block + 1 for s in p.stages] == [2, 2, 2, 2]
    assert p.latency_s == pytest.approx(8 + 3 * 2)
    # Tuple form with fits_memory = False is infeasible.
    q = wp.partition_dp(2, c, lambda i, j, m: (1.0, 0.0, subs[m].num_devices == 8), num_microbatches=2)
    assert [subs[s.submesh_index].num_devices for s in q.stages] == [8]
    with pytest.raises(ValueError):
        wp.partition_dp(2, c, lambda i, j, m: "bad")
    with pytest.raises(ValueError):
        wp.partition_dp(2, subs, lambda i, j, m: 1.0)  # total_devices missing


def test_partition_ilp_small_dag_matches_enumeration():
    d = wp.dag([3, 1, 2, 2, 1, 3], [(0, [1, 3], 10), (1, [2], 4), (2, [5], 6), (3, [4], 3), (4, [5], 9)])
    ex = wp.partition_dag_exhaustive(d, 2, 0.3)
    assert ex.has_solution
    # Independent enumeration.
    best = None
    for st in itertools.product(range(2), repeat=6):
        st = list(st)
        if not wp.feasible_partition(d, st, 2, 0.3):
            continue
        c = wp.cut_bytes(d, st)
        best = c if best is None else min(best, c)
    for tight in (True, False):
        r = wp.partition_dag_ilp(d, 2, epsilon=0.3, bound_tightening=tight)
        assert r.status == "optimal"
        assert r.cut_bytes == best == ex.cut_bytes
    b = wp.stage_bounds(d, 2, 0.3)
    assert all(lo <= s <= hi for lo, s, hi in zip(b.lower, r.stage_of_node, b.upper))


def test_partition_ilp_unet_not_worse_than_linear():
    g = weft.models.unet(base_channels=4, depth=3, in_channels=1, classes=2, image=16).train_step()
    d = wp.dag_from_graph(g)
    r = wp.partition_ilp(g, num_stages=3, epsilon=0.25)
    assert r.has_solution and r.status == "optimal"
    assert len(r.stage_of_op) == len(g.ops) and all(0 <= s < 3 for s in r.stage_of_op)
    # Best contiguous split of the node order (a topological order), brute force over 2 cuts.
    n, tot = d.num_nodes, sum(d.compute)
    lin = None
    for a in range(1, n):
        for b in range(a + 1, n):
            st = [0] * a + [1] * (b - a) + [2] * (n - b)
            if wp.feasible_partition(d, st, 3, 0.25):
                c = wp.cut_bytes(d, st)
                lin = c if lin is None else min(lin, c)
    assert lin is not None and r.cut_bytes <= lin
    assert sum(r.stage_flops) == pytest.approx(tot)
