"""Frontends: build a weft graph from a model written in another framework.

- :mod:`weft.frontend.torch` -- a PyTorch ``nn.Module`` captured with ``torch.export``
  (:func:`from_torch`, :func:`feeds_from_torch`). torch is imported only when these are called.

See docs/modules/frontend.md.
"""
from __future__ import annotations

__all__ = ["from_torch", "feeds_from_torch", "supported_ops"]


def from_torch(module, example_inputs, *args, **kwargs):
    """See :func:`weft.frontend.torch.from_torch`."""
    from .torch import from_torch as _f
    return _f(module, example_inputs, *args, **kwargs)


def feeds_from_torch(module, example_inputs, *args, **kwargs):
    """See :func:`weft.frontend.torch.feeds_from_torch`."""
    from .torch import feeds_from_torch as _f
    return _f(module, example_inputs, *args, **kwargs)


def supported_ops():
    """The ATen ops the torch importer maps (sorted names)."""
    from .torch import supported_ops as _f
    return _f()
