"""O2's memory pricing against O3 under tight memory limits (issue 17's SPMD fix list: "O2's memory
pricing must not land above O3"; the reported case — one GPT block's train step on a 1x8 DGX-A100
mesh at 587 MB, O2 4.47 ms against O3's 4.01 ms — came from an older cost model and is not
reproduced by any block of the sweep in docs/modules/spmd.md). O3 solves one ILP to optimality
here, so it bounds O2 from below; O2 (segments stitched by DP, memory priced per byte before any
memory row) stays within 3 % of it at limits down to the tightest that fit."""
import pytest

import weft


@pytest.mark.parametrize("hidden,seq,batch,fraction", [(1024, 512, 8, 0.6), (2048, 1024, 8, 0.75),
                                                       (1024, 1024, 16, 0.9)])
def test_o2_with_memory_pricing_stays_within_3_percent_of_o3(hidden, seq, batch, fraction):
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    mesh = weft.DeviceMesh([1, 8], list(range(8)))
    g = weft.models.gpt(layers=1, hidden=hidden, heads=hidden // 64, seq=seq, vocab=1024,
                        batch=batch).train_step(optimizer="adam")
    # The limits: fractions of the peak of the plan that charges every reader its own resharding
    # (the sweep's); shared resharding (on below) shards more and peaks lower when memory is free.
    free = weft.spmd_search(g, c, mesh, level="O3", memory_limit=-1, time_limit=60, shared_resharding=False)
    limit = free.peak_memory * fraction
    o3 = weft.spmd_search(g, c, mesh, level="O3", memory_limit=limit, time_limit=60)
    o2 = weft.spmd_search(g, c, mesh, level="O2", memory_limit=limit, time_limit=60)
    assert o3.peak_memory <= limit * (1 + 1e-9) and o2.peak_memory <= limit * (1 + 1e-9)
    assert o3.cost <= o2.cost * (1 + 1e-9)  # O3 is the optimum of the same model
    assert o2.cost <= 1.03 * o3.cost, (o2.cost, o3.cost)
