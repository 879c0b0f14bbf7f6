"""The Energon guards (energon_pack.energon.compat): nothing patched at import, installed when our encoder is
built on a tested Energon release, nothing installed (and one warning) on an untested one."""

import subprocess
import sys
import textwrap
import warnings

import pytest
from megatron.energon.savable_loader import SavableDataLoader, SavableDatasetWrapper

from energon_pack.energon import TextPackingTaskEncoder, compat


def _patched() -> list:
    """The three methods the guards replace, as they are now."""
    return [
        SavableDataLoader.save_state_rank,
        SavableDataLoader.restore_state_rank,
        SavableDatasetWrapper.get_checkpoint,
    ]


@pytest.fixture
def unpatched():
    """Energon's own methods for the test; the guards as they were afterwards (other tests rely on them)."""
    was = compat.energon_guards_installed()
    compat.uninstall_energon_guards()
    originals = _patched()
    yield originals
    compat.uninstall_energon_guards()
    if was:
        compat.install_energon_guards()


IMPORT_ONLY = textwrap.dedent("""
    from megatron.energon.savable_loader import SavableDataLoader, SavableDatasetWrapper
    def methods():
        return [SavableDataLoader.save_state_rank, SavableDataLoader.restore_state_rank,
                SavableDatasetWrapper.get_checkpoint]
    before = methods()
    import energon_pack, energon_pack.energon, energon_pack.qwen_vl.task_encoder, energon_pack.integrations.bridge
    from energon_pack.energon import energon_guards_installed
    assert all(a is b for a, b in zip(before, methods())), "importing patched Energon"
    assert not energon_guards_installed()
    energon_pack.energon.TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
    assert energon_guards_installed() and all(a is not b for a, b in zip(before, methods()))
    print("OK")
""")


def test_import_leaves_energon_untouched_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_building_our_encoder_installs_the_guards(unpatched):
    assert compat.ENERGON_VERSION in compat.TESTED_ENERGON_VERSIONS  # the environments the project runs
    assert not compat.energon_guards_installed()
    TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
    assert compat.energon_guards_installed()
    now = _patched()
    assert all(new is not old and new.__wrapped__ is old for new, old in zip(now, unpatched))
    assert compat.install_energon_guards() and _patched() == now  # idempotent: not wrapped twice
    compat.uninstall_energon_guards()
    assert all(a is b for a, b in zip(_patched(), unpatched)) and not compat.energon_guards_installed()


def test_an_untested_energon_version_installs_nothing_and_warns_once(unpatched, monkeypatch):
    monkeypatch.setattr(compat, "ENERGON_VERSION", "9.9.9")
    monkeypatch.setattr(compat, "_warned", [])
    with pytest.warns(
        RuntimeWarning,
        match=r"megatron-energon 9\.9\.9 is not one .* tested on .*can hang.*stale "
        r"checkpoint.*Fix: pin megatron-energon==7\.4\.1, or call energon_pack\.energon\.save_state_rank",
    ) as record:
        TextPackingTaskEncoder(tokenizer="demo", seq_length=256)
        assert compat.install_energon_guards() is False
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    assert all(a is b for a, b in zip(_patched(), unpatched)) and not compat.energon_guards_installed()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        TextPackingTaskEncoder(tokenizer="demo", seq_length=256)  # once per process


def test_an_encoder_overriding_the_old_fingerprint_hook_is_refused_by_name():
    from energon_pack.energon import TextPackingTaskEncoder
    from energon_pack.errors import ConfigError

    class Old(TextPackingTaskEncoder):
        def packing_fingerprint(self, packing_buffer_size):  # the pre-issue-31 hook
            return {"mine": 1}

    with pytest.raises(ConfigError) as err:
        Old(tokenizer="demo", seq_length=256)
    assert err.value.knob == "packing_fingerprint" and "resume_knobs()" in err.value.fix
