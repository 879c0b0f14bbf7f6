"""Energon's JSONL indexer asserts on a line that is not one {...} object: we name the line and the fix."""

import pytest

from energon_pack.energon import prepare_jsonl
from energon_pack.errors import ConfigError


@pytest.mark.parametrize(
    "content, expected",
    [
        (
            b'\xef\xbb\xbf{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"}\n',
            "line 1 starts with a UTF-8 byte-order mark",
        ),
        (
            b'{"prompt": "a", "completion": "b"}\n{"prompt": \n{"prompt": "c", "completion": "d"}\n',
            "line 2 is not one JSON object",
        ),
        (b'[{"prompt": "a"}]\n', "line 1 is not one JSON object"),
    ],
)
def test_energon_jsonl_prepare_names_the_line_it_refuses(tmp_path, content, expected):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        prepare_jsonl(path)
    assert expected in str(err.value) and err.value.knob == "jsonl" and "JsonlSFTDataset" in str(err.value)


def test_energon_jsonl_prepare_of_good_lines_counts_them(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": "d"}\n')
    assert prepare_jsonl(path) == 2
