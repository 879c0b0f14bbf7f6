"""``energon-pack stress`` rows: every target figure of the topology, convert and faults parts is checked; count
rows (info) never miss a target, a missing figure always does."""

import pytest

from report import INFO, TRUE, _met, rows_for


@pytest.mark.stress
@pytest.mark.parametrize("part", ["topology", "convert", "faults"])
def test_new_parts_have_target_rows_that_miss_on_any_nonzero_figure(part):
    rows = rows_for(part, {})
    targets = [figure for figure, _ in rows if figure not in INFO]
    assert len(targets) >= 4 and not any(_met(figure, None) for figure in targets)
    assert all(_met(figure, True) and not _met(figure, False) for figure in targets if figure in TRUE)
    assert all(_met(figure, 0) and not _met(figure, 1) for figure in targets if figure not in TRUE)
    assert all(_met(figure, 7) for figure, _ in rows if figure in INFO)
