"""Test helpers: a module run by torch in float64 throughout, its float32 islands removed.

Hugging Face models compute parts in float32 whatever the module's dtype (RMSNorm's
``hidden_states.to(torch.float32)``, the rotary tables' ``.float()``, ``softmax(..., dtype=torch.float32)``,
the loss's ``logits.float()``). ``Float64Throughout`` is a torch function mode under which every such
conversion keeps float64: it works at torch's API level (``Tensor.float`` / ``.to`` / ``.type`` and any
``dtype=`` argument), independently of weft's importer, which drops those casts itself
(``weft.from_torch(float_casts="ignore")``). ``FloatDtypesSeen`` records, at the ATen level (forward
and backward), the dtype of every floating point tensor an op produces: the proof that no float32
value is left."""
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def _f64(v):
    if v is torch.float32:
        return torch.float64
    if isinstance(v, (list, tuple)):
        return type(v)(_f64(x) for x in v)
    return v


class Float64Throughout(TorchFunctionMode):
    """Every conversion to float32 (of a float64 tensor: a no-op; of an integer one: to float64) and
    every float32 ``dtype=`` argument (softmax's, a factory's) made float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func is torch.Tensor.type and (args[1:2] or [kwargs.get("dtype")])[0] in (torch.float32, "torch.FloatTensor"):
            return args[0] if args[0].dtype == torch.float64 else args[0].double()
        return func(*_f64(tuple(args)), **{k: _f64(v) for k, v in kwargs.items()})


class FloatDtypesSeen(TorchDispatchMode):
    """The set of float dtypes of the tensors every ATen op returns while active."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()
        self.ops_by_dtype = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(o, torch.Tensor) and o.is_floating_point():
                self.dtypes.add(o.dtype)
                self.ops_by_dtype.setdefault(o.dtype, set()).add(str(func))
        return out
