"""ShardingSpec tile math against a numpy oracle (the factor view), partial specs, resharding
plans executed by a numpy data mover, reshape propagation, notations and errors."""
import os

import numpy as np
import pytest

import weft
from weft.sharding import assemble, distribute, mesh_coords

SAN = os.environ.get("WEFT_SANITIZED") == "1"


def factor_view_indices(spec, coord, d):
    """Independent oracle: view the padded dim as factors [N'/(s0 k0), k0, s0/(s1 k1), k1, ..., s_last]
    (digits major first), pick this device's coordinate on every k factor, ravel."""
    n = spec.tensor_shape[d]
    npad = spec.padded_size(d)
    digits = []
    for a in spec.axes_of_dim(d):
        k = spec.mesh_shape[a]
        if k > 1:
            digits.append((spec.placements[a].stride, k, coord[a]))
    digits.sort(key=lambda t: -t[0])
    factors, index = [], []
    upper = npad
    for s, k, c in digits:
        factors += [upper // (s * k), k]
        index += [slice(None), c]
        upper = s
    factors.append(upper)
    index.append(slice(None))
    idx = np.arange(npad).reshape(factors)[tuple(index)].ravel()
    return idx[idx < n]


def random_spec(rng, padding):
    while True:
        mesh = [int(rng.integers(1, 5)) for _ in range(int(rng.integers(1, 4)))]
        rank = int(rng.integers(1, 4))
        if padding:
            shape = [int(rng.integers(1, 30)) for _ in range(rank)]
        else:
            shape = [int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24])) for _ in range(rank)]
        toks = []
        for _ in mesh:
            r = rng.integers(0, 6)
            if r == 0:
                toks.append("R")
            elif r == 1:
                toks.append("P(sum)")
            else:
                d = int(rng.integers(0, rank))
                n = shape[d]
                if rng.integers(0, 2):
                    divs = [s for s in range(1, n + 1) if n % s == 0]
                    toks.append(f"S({d},{int(rng.choice(divs))})")
                else:
                    toks.append(f"S({d})")
        try:
            return weft.ShardingSpec.parse(" ".join(toks), shape, mesh, allow_padding=padding)
        except ValueError:
            continue


@pytest.mark.parametrize("padding", [False, True])
def test_tiles_match_factor_view_oracle(padding):
    rng = np.random.default_rng(2024 + padding)
    cases = (60 if SAN else 400) if not padding else (30 if SAN else 200)
    for _ in range(cases):
        spec = random_spec(rng, padding)
        x = rng.standard_normal(spec.tensor_shape)
        count = np.zeros(spec.tensor_shape, dtype=int)
        for c in mesh_coords(spec.mesh_shape):
            idx = spec.tile(list(c))
            for d in range(spec.rank):
                np.testing.assert_array_equal(idx[d], factor_view_indices(spec, c, d))
                for l, g in enumerate(idx[d]):
                    assert spec.global_index(list(c), d, l) == g
                    assert spec.local_index(list(c), d, int(g)) == l
            assert spec.local_shape(list(c)) == [len(i) for i in idx]
            count[np.ix_(*idx)] += 1
        # every element is on exactly devices / shards devices
        shards = int(np.prod([spec.num_shards(d) for d in range(spec.rank)]))
        assert (count == int(np.prod(spec.mesh_shape)) // shards).all()
        # partial terms reduce to the value; round trip exact
        np.testing.assert_allclose(assemble(distribute(x, spec, seed=1), spec), x, rtol=0, atol=1e-12)
        assert weft.ShardingSpec.parse(str(spec), spec.tensor_shape, spec.mesh_shape, padding) == spec


def test_rhino_examples_and_notations():
    s = weft.ShardingSpec.parse("S(1)", [4, 2], [2])
    out, why = weft.propagate_reshape(s, [8])
    assert str(out) == "S(0,1)" and why == ""
    h, k = 16, 4
    qkv, _ = weft.propagate_reshape(weft.ShardingSpec.parse("S(2)", [h, 3, h], [k]), [h, 3 * h])
    assert qkv.placements[0] == weft.Placement.shard(1, h // k)
    np.testing.assert_array_equal(qkv.tile([1])[1], np.concatenate([np.arange(4, 8) + j * h for j in range(3)]))
    none, why = weft.propagate_reshape(weft.ShardingSpec.parse("S(0)", [8], [4]), [2, 4])
    assert none is None and "straddles" in why
    assert len(weft.enumerate_specs([256, 256], [4])) == 16
    t = weft.ShardingSpec.parse("S(0,2) S(0,4)", [8, 4], [2, 2])
    assert t.to_alpa() == "S10R"
    assert t.to_jax(["dp", "tp"]) == "P(('tp', 'dp'), None)"
    assert t.to_dtensor() == "[_StridedShard(dim=0, split_factor=2), Shard(0)]"
    assert weft.ShardingSpec.parse_alpa("S10R", [8, 4], [2, 2]) == t
    assert hash(t) == hash(weft.ShardingSpec.parse("S(0,2) S(0,4)", [8, 4], [2, 2]))


@pytest.mark.parametrize(
    "text,shape,mesh,msg",
    [
        ("S(0,3)", [8], [2], "does not divide"),
        ("S(1)", [8], [2], "out of range"),
        ("S(0)", [6], [4], "not divisible"),
        ("S(0,2) S(0,2)", [8], [2, 2], "overlap"),
        ("S(0)", [8], [2, 2], "2-D mesh"),
        ("P(sum) P(max)", [8], [2, 2], "mix"),
        ("X", [8], [2], "unknown placement"),
    ],
)
def test_invalid_specs_raise(text, shape, mesh, msg):
    with pytest.raises(ValueError, match=msg):
        weft.ShardingSpec.parse(text, shape, mesh)


def run_plan(local, plan):
    """numpy data mover: a step along axis a reads only from devices of the same axis-a group."""
    for st in plan.steps:
        src, dst, a = st.src, st.dst, st.axis
        red = src.reduce or dst.reduce or "sum"
        new = {}
        for c in mesh_coords(dst.mesh_shape):
            group = [tuple(c[:a]) + (i,) + tuple(c[a + 1:]) for i in range(dst.mesh_shape[a])]
            if st.kind in ("local-slice", "local-partial"):
                group = [c]
            idx = dst.tile(list(c))
            out = np.full([len(i) for i in idx], np.nan)
            vals = []
            for q in group:
                have = src.tile(list(q))
                masks = [np.isin(i, h) for i, h in zip(idx, have)]
                pos = [np.searchsorted(h, i[m]) for h, i, m in zip(have, idx, masks)]
                if all(m.all() for m in masks):
                    vals.append(local[q][np.ix_(*pos)])
                if st.kind in ("all-gather", "all-to-all", "local-slice", "local-partial"):
                    out[np.ix_(*masks)] = local[q][np.ix_(*pos)]  # each device sends what it holds
            if st.kind in ("all-reduce", "reduce-scatter"):
                assert len(vals) == len(group), f"{st}: device {c}: a group member lacks a term"
                out = np.sum(vals, axis=0) if red == "sum" else np.max(vals, axis=0)
            elif st.kind == "local-partial" and c[a] != 0 and red == "sum":
                out = np.zeros_like(out)
            assert not np.isnan(out).any(), f"{st}: device {c} cannot get its data inside its group"
            new[c] = out
        local = new
    return local


def test_resharding_plans_execute_exactly():
    rng = np.random.default_rng(5)
    for shape, mesh in [([8, 4], [2, 2]), ([12, 2], [3, 2]), ([8, 2, 4], [2, 1, 2])]:
        specs = weft.enumerate_specs(shape, mesh)
        links = [weft.AxisLink(n, 1e-5, 1e-9 * (a + 1)) for a, n in enumerate(mesh)]
        planner = weft.ReshardPlanner(links, "f32")
        x = rng.standard_normal(shape)
        for _ in range(10 if SAN else 40):
            a, b = specs[rng.integers(len(specs))], specs[rng.integers(len(specs))]
            plan = planner.plan(a, b)
            out = run_plan(distribute(x, a, seed=3), plan)
            np.testing.assert_allclose(assemble(out, b), x, atol=1e-12)
            assert plan.time == pytest.approx(sum(s.time for s in plan.steps))


def test_reshard_on_mesh_with_cluster():
    c = weft.Cluster.preset("M8", 2)
    mesh = weft.DeviceMesh.iota([2, 8])
    a = weft.ShardingSpec.parse("P(sum) S(0)", [1024, 1024], [2, 8])
    b = weft.ShardingSpec.parse("R S(0)", [1024, 1024], [2, 8])
    plan = weft.reshard_on_mesh(a, b, cluster=c, mesh=mesh, dtype="f16")
    assert [s.kind for s in plan.steps] == ["all-reduce"]
    nbytes = 1024 * 1024 * 2 / 8
    link = mesh.axis_links(c)[0]
    assert plan.time == pytest.approx(2 * 0.5 * nbytes * link.inter_beta + 2 * link.inter_alpha, rel=1e-9)
    with pytest.raises(ValueError):
        weft.reshard_on_mesh(a, b)
