"""Every public object has a docstring: what ``weft`` and its public submodules export (functions,
classes, modules) and the methods and properties of those classes, C++ bindings included (the
properties the bindings leave bare get theirs from weft._docs, with units)."""
import inspect
import types

import weft


def public_objects(root=weft):
    """(qualified name, object) of every public object."""
    seen, out = set(), []

    def members(prefix, mod, depth):
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        for name in names:
            v = getattr(mod, name, None)
            q = f"{prefix}.{name}"
            if isinstance(v, types.ModuleType):
                if v.__name__.startswith("weft") and depth == 0 and id(v) not in seen:
                    seen.add(id(v))
                    out.append((q, v))
                    members(q, v, 1)
                continue
            if not (inspect.isclass(v) or callable(v)) or getattr(v, "__module__", "") == "__future__":
                continue  # data: constants, type aliases, `from __future__ import annotations`
            out.append((q, v))
            if inspect.isclass(v) and id(v) not in seen:
                seen.add(id(v))
                for m, a in vars(v).items():
                    if not m.startswith("_") and (isinstance(a, (property, staticmethod, classmethod)) or callable(a)):
                        out.append((f"{q}.{m}", a))

    members("weft", root, 0)
    return out


def test_no_public_object_without_a_docstring():
    objs = public_objects()
    names = {q for q, _ in objs}
    assert len(objs) > 500 and {"weft.plan", "weft.Plan.step_time", "weft.Graph.matmul", "weft.reshard.plan",
                                "weft.Tensor", "weft.SimulationResult.plot_gantt", "weft.pipeline.Block"} <= names
    missing = [q for q, o in objs if not (getattr(o, "__doc__", None) or "").strip()]
    assert missing == [], f"{len(missing)} without a docstring: {missing[:40]}"


def test_property_docstrings_carry_units():
    assert "(s)" in weft.Plan.step_time.__doc__ and "(bytes)" in weft.Plan.peak_memory.__doc__
    assert "bytes/s" in weft.PipelineLink.bandwidth.__doc__ and "(s)" in weft.StageSpec.forward_time.__doc__
    assert "FLOP/s" in weft.DeviceSpec.peak_flops.__doc__ and "(s)" in weft.reshard.CrossMeshOp.start.__doc__
