"""The object-storage guide's MSC config for S3 (docs/guides/object_storage.md), as written (its endpoint
pointed at the test server), read by a fresh process with the credentials only in the environment: it lists and
reads the uploaded dataset."""

import json
import os
import re
import subprocess
import sys

from _docs import block_after_marker

GUIDE = "docs/guides/object_storage.md"


def readme_config() -> str:
    """The YAML block after the ``tests/examples/test_remote_readme.py`` marker of the guide."""
    return block_after_marker(GUIDE, "<!-- tested: tests/examples/test_remote_readme.py", "yaml")


def test_readme_config_reads_the_bucket(s3_store, remote_demo, demo_shards, tmp_path):
    config = readme_config()
    assert "key" not in config.lower() and "secret" not in config.lower()  # no credentials in the file
    endpoint = re.search(r"endpoint_url: (\S+)", config).group(1)
    (tmp_path / "msc.yaml").write_text(config.replace(endpoint, s3_store.endpoint))
    profile = re.search(r"^  (\S+):$", config, re.M).group(1)
    url = remote_demo.replace("msc://energon-s3/", f"msc://{profile}/")
    code = (
        "import json, sys; from energon_pack.storage import epath, list_names; "
        "print(json.dumps([list_names(sys.argv[1]), (epath(sys.argv[1]) / '.nv-meta/split.yaml').read_text()]))"
    )
    env = {**os.environ, "MSC_CONFIG": str(tmp_path / "msc.yaml")}
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    names, split = json.loads(out.stdout.splitlines()[-1])
    local = sorted(p.relative_to(demo_shards).as_posix() for p in demo_shards.rglob("*") if p.is_file())
    assert names == local
    assert split == (demo_shards / ".nv-meta" / "split.yaml").read_text()
