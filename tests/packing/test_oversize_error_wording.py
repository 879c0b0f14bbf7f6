"""OversizeError names the knob users set (``overlength``) beside the packers' own ``on_oversize`` (issue 45)."""

import pytest

from energon_pack.packing import OnlinePacker, OversizeError, best_fit_decreasing, first_fit_decreasing

FIX = "set overlength='skip' (on_oversize='skip' on a packer you build) to count and skip such items"


def test_online_packer_oversize_error_names_overlength():
    packer = OnlinePacker(capacity=10, on_oversize="error")
    with pytest.raises(OversizeError) as err:
        packer.push("a", 11)
    assert str(err.value) == f"item 'a' with cost [11] exceeds capacity [10]; {FIX}"


@pytest.mark.parametrize("pack", [first_fit_decreasing, best_fit_decreasing])
def test_offline_packers_oversize_error_names_overlength(pack):
    with pytest.raises(OversizeError) as err:
        pack([3, 12], 10)
    assert str(err.value) == f"item 1 with cost [12] exceeds capacity [10]; {FIX}"
