import pytest

import weft


def test_dtype_size():
    assert weft.dtype_size("bf16") == 2
    assert weft.dtype_size("f64") == 8


def test_unknown_dtype_is_value_error():
    with pytest.raises(ValueError, match="unknown dtype"):
        weft.dtype_size("f8")
