"""The user's cache folder as a trust boundary (issue 42): a kernel is loaded from the very bytes
that were checked (a file swapped between the build or the check and the load is never what
runs), a folder that another user could replace is not used, and the folder stays under its
size cap, least recently used entries first; the private fallback folder goes at exit.

Tests run as root in CI, where every file is "ours": other users are simulated with
``os.chown`` to uid/gid 12345 (skipped when not root) and with folders open to everyone."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

from ge_core import cache as ge_cache
from ge_native import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler or Python/NumPy headers")

ROOT = os.geteuid() == 0
OTHER = 12345  # a user and group that is not this process's

#: the canary kernel: out[i] = x[i] * k + ADD (ADD differs between the real one and the impostor)
SRC = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native_canary.c"), encoding="ascii").read()
GOOD, EVIL = 7.0, 1007.0


def compile_as(modname: str, source: str, out: str) -> bytes:
    """A valid extension module of ``source`` whose init is ``modname``'s (an impostor that
    would load in its place), compiled the way native.build does."""
    c = out[:-3] + ".c"
    with open(c, "w", encoding="ascii") as f:
        f.write(native.module_source(modname, source, ["canary"]))
    r = native.run_compiler(c, out)
    assert r.returncode == 0, r.stderr[-2000:]
    with open(out, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """The real canary source, its key, and two prebuilt modules with its init: the real one
    and an impostor (adds 1007 instead of 7)."""
    base = tmp_path_factory.mktemp("kit")
    good = SRC.replace("ADDf", f"{GOOD}f")
    full = good + native._module_table(["canary"])
    modname = f"ge_{native.key_for(full)}"
    return {"src": good, "key": native.key_for(full), "modname": modname,
            "good": compile_as(modname, good, str(base / "good.so")),
            "evil": compile_as(modname, SRC.replace("ADDf", f"{EVIL}f"), str(base / "evil.so"))}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder of this test (GE_CACHE_DIR), no hook, no module of the canary kept
    in this process, and the fallback/eviction state of ge_core.cache restored afterwards."""
    monkeypatch.setenv("GE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GE_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setattr(native, "before_load", None)
    saved = dict(ge_cache._state)
    yield tmp_path / "cache" / f"v{ge_cache.FORMAT}"
    if ge_cache._state.get("fallback") != saved.get("fallback"):
        ge_cache.remove_fallback()  # this test's private folder (the exit would not know it)
    ge_cache._state.clear()
    ge_cache._state.update(saved)


def fresh_build(kit):
    """native.build of the canary as if for the first time in this process (the cache decides)."""
    native._modules.pop(kit["key"], None)
    return native.build(kit["src"], ["canary"])


def added(mod) -> float:
    out = np.empty(3, np.float32)
    mod.canary(np.zeros(3, np.float32), out, 2.0)
    return float(out[0])


def install(d, kit, body: bytes, sum_of: bytes | None = None) -> tuple[str, str]:
    """Put ``body`` in the cache as the canary's entry, with the sum of ``sum_of`` (default: of
    ``body``)."""
    os.makedirs(d, mode=0o700, exist_ok=True)
    so, total = os.path.join(d, kit["modname"] + ".so"), os.path.join(d, kit["modname"] + ".sum")
    for path, data in ((so, body), (total, (hashlib.sha256(sum_of or body).hexdigest() + "\n").encode())):
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
    return so, total


# ------------------------------------------------------------------------------------------------
# the bytes checked are the bytes loaded
# ------------------------------------------------------------------------------------------------
def test_a_valid_module_swapped_in_after_the_build_is_not_loaded(cache, kit):
    swapped = []

    def swap(stage, so):  # another user's (or a stray process's) rename between build and load
        if stage == "built":
            with open(so + ".tmp", "wb") as f:
                f.write(kit["evil"])
            os.chmod(so + ".tmp", 0o600)
            os.replace(so + ".tmp", so)
            swapped.append(so)

    native.before_load = swap
    before = dict(native.stats())
    mod = fresh_build(kit)
    assert swapped and added(mod) == GOOD  # what was built (and hashed) is what runs
    assert native.stats()["compiled"] == before["compiled"] + 1
    assert mod.__file__ == swapped[0]
    # the file left in the cache is the impostor, but it does not match the sum of the build:
    # the next load refuses it and builds again
    native.before_load = None
    mod = fresh_build(kit)
    assert added(mod) == GOOD
    assert native.stats()["rebuilt"] == before["rebuilt"] + 1


def test_a_consistent_pair_swapped_in_after_the_check_is_not_loaded(cache, kit):
    so, total = install(cache, kit, kit["good"])

    def swap(stage, path):  # both files replaced after they were read and checked
        assert stage == "cached" and path == so
        install(cache, kit, kit["evil"])

    native.before_load = swap
    before = dict(native.stats())
    mod = fresh_build(kit)
    assert added(mod) == GOOD and native.stats()["cached"] == before["cached"] + 1
    with open(so, "rb") as f:
        assert f.read() == kit["evil"]  # the swap happened; it was simply not what was loaded


def test_the_checked_entry_loads_and_a_wrong_or_linked_one_is_rebuilt(cache, kit, tmp_path):
    install(cache, kit, kit["good"])
    before = dict(native.stats())
    assert added(fresh_build(kit)) == GOOD
    assert native.stats()["cached"] == before["cached"] + 1 and native.stats()["compiled"] == before["compiled"]
    # an impostor with the sum of the real one: refused (hash), rebuilt
    install(cache, kit, kit["evil"], sum_of=kit["good"])
    assert added(fresh_build(kit)) == GOOD
    assert native.stats()["rebuilt"] == before["rebuilt"] + 1
    # a link to a file that does hash to its sum: not followed, rebuilt
    target = tmp_path / "elsewhere.so"
    target.write_bytes(kit["evil"])
    so, _ = install(cache, kit, kit["evil"])
    os.unlink(so)
    os.symlink(target, so)
    assert not ge_cache.entry_ok(so, so[:-3] + ".sum")
    assert added(fresh_build(kit)) == GOOD
    assert native.stats()["rebuilt"] == before["rebuilt"] + 2
    assert not os.path.islink(so)


@pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
def test_an_entry_of_another_user_is_not_loaded(cache, kit):
    so, total = install(cache, kit, kit["evil"])
    os.chown(so, OTHER, OTHER)
    assert ge_cache.read_entry(so, total) is None
    assert added(fresh_build(kit)) == GOOD
    assert os.stat(so).st_uid == os.geteuid()


def test_a_folder_removed_during_a_build_is_checked_again(cache, kit, monkeypatch, tmp_path):
    real = native.cache_dir
    calls = []

    def vanishing():  # the first answer is a folder that is gone by the time it is written to
        calls.append(1)
        return str(tmp_path / "gone") if len(calls) == 1 else real()

    monkeypatch.setattr(native, "cache_dir", vanishing)
    mod = fresh_build(kit)
    assert added(mod) == GOOD and len(calls) >= 2 and mod.__file__.startswith(real())


def test_loading_leaves_no_descriptor_open(cache, kit):
    install(cache, kit, kit["good"])
    fresh_build(kit)  # the pool and the imports are there before counting
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    for _ in range(5):
        assert added(fresh_build(kit)) == GOOD
    if before:
        assert len(os.listdir("/proc/self/fd")) == before


def test_modules_loaded_through_reused_descriptor_numbers_stay_apart(cache, kit, tmp_path):
    """The dynamic loader hands back the library it loaded before under the same path: each
    load names its descriptor by a path no earlier load used, so a second module is itself."""
    good = native._load(kit["modname"], str(cache / "a.so"), kit["good"])
    evil = native._load(kit["modname"], str(cache / "b.so"), kit["evil"])
    assert added(good) == GOOD and added(evil) == EVIL


def test_without_memfd_the_checked_bytes_load_from_a_private_copy(cache, kit, monkeypatch, tmp_path):
    """Where executable memfds are refused (vm.memfd_noexec=2) or missing (not Linux), the
    checked bytes are copied into a new private folder, loaded from there, and the copy goes."""
    import errno

    def refuse(*a, **k):
        raise OSError(errno.EACCES, "memfd refused")

    monkeypatch.setattr(os, "memfd_create", refuse)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    so, _ = install(cache, kit, kit["good"])
    mod = native._load(kit["modname"], so, kit["evil"])  # the bytes given, not the file's
    assert added(mod) == EVIL and mod.__file__ == so
    assert not [p for p in os.listdir(tmp_path) if p.startswith("ge-load-")]


def test_cache_data_is_read_through_one_descriptor(cache):
    ge_cache.write_data("trust_probe", b"payload")
    assert ge_cache.read_data("trust_probe") == b"payload"
    d = ge_cache.cache_dir()
    dat = os.path.join(d, "trust_probe.dat")
    other = os.path.join(d, "elsewhere")
    with open(other, "wb") as f:
        f.write(b"payload")
    os.unlink(dat)
    os.symlink(other, dat)  # the same bytes, through a link: not followed
    assert ge_cache.read_data("trust_probe") is None
    os.unlink(dat)
    os.mkfifo(dat, 0o600)  # a FIFO in its place: refused without blocking
    assert ge_cache.read_data("trust_probe") is None


def test_the_blas_is_taken_only_from_libraries_already_loaded(monkeypatch, tmp_path):
    """gemm's ctypes.CDLL opens NumPy's BLAS with RTLD_NOLOAD: a path threadpoolctl reports
    that is not (or no longer) the loaded library maps nothing new."""
    import threadpoolctl

    from ge_native import gemm

    lib = tmp_path / "libfake_blas.so"
    c = tmp_path / "fake.c"
    c.write_text("void cblas_sgemm(void) {}\nvoid cblas_dgemm(void) {}\n")
    subprocess.run([native.compiler(), "-shared", "-fPIC", str(c), "-o", str(lib)], check=True, timeout=120)
    monkeypatch.setattr(threadpoolctl, "threadpool_info",
                        lambda: [{"user_api": "blas", "filepath": str(lib)}])
    assert gemm._cblas() is None
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        assert str(lib) not in f.read()


# ------------------------------------------------------------------------------------------------
# which folders may hold the cache
# ------------------------------------------------------------------------------------------------
def cache_in(parent, monkeypatch) -> tuple[str, list[str]]:
    monkeypatch.setenv("GE_CACHE_DIR", str(parent / "cache"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        d = ge_cache.cache_dir()
    return d, [str(m.message) for m in w]


def test_a_folder_under_a_world_writable_one_without_sticky_bit_is_not_used(cache, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone may rename our folder away and put theirs in its place
    d, said = cache_in(shared, monkeypatch)
    assert not d.startswith(str(shared)) and os.path.basename(d).startswith(ge_cache.FALLBACK_PREFIX)
    assert any("is not used" in m and "writable by every user" in m for m in said), said
    assert not (shared / "cache").exists() or not any((shared / "cache").rglob("*.sum"))
    ge_cache.write_data("trust_probe", b"x")  # written to the private folder, read back from it
    assert ge_cache.read_data("trust_probe") == b"x"
    assert os.path.exists(os.path.join(d, "trust_probe.dat"))


def test_a_folder_under_a_sticky_world_writable_one_is_used(cache, tmp_path, monkeypatch):
    shared = tmp_path / "sticky"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: nobody else can rename what we put there
    d, said = cache_in(shared, monkeypatch)
    assert d == os.path.realpath(shared / "cache" / f"v{ge_cache.FORMAT}") and not said
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_the_folder_is_checked_again_for_every_use(cache, tmp_path, monkeypatch, kit):
    parent = tmp_path / "was-private"
    parent.mkdir(mode=0o700)
    d, said = cache_in(parent, monkeypatch)
    assert d.startswith(str(parent)) and not said
    os.chmod(parent, 0o777)  # opened up while the process runs
    with pytest.warns(UserWarning, match="is not used"):
        mod = fresh_build(kit)
    assert added(mod) == GOOD and not mod.__file__.startswith(str(parent))
    assert not os.path.exists(os.path.join(d, kit["modname"] + ".so"))


@pytest.mark.skipif(not ROOT, reason="chown to another user needs root")
def test_folders_of_another_user_are_not_used_nor_written(cache, tmp_path, monkeypatch):
    above = tmp_path / "theirs"
    above.mkdir(mode=0o755)
    os.chown(above, OTHER, OTHER)  # another user's folder, not writable by us or others
    d, said = cache_in(above, monkeypatch)
    assert not d.startswith(str(above)) and any("belongs to another user" in m for m in said), said
    # the cache folder itself another user's (even if nobody else may write it)
    own = tmp_path / "mine"
    (own / "cache" / f"v{ge_cache.FORMAT}").mkdir(parents=True, mode=0o700)
    os.chown(own / "cache" / f"v{ge_cache.FORMAT}", OTHER, OTHER)
    d, said = cache_in(own, monkeypatch)
    assert not d.startswith(str(own)) and said
    ge_cache.write_data("trust_probe", b"x")
    assert os.listdir(own / "cache" / f"v{ge_cache.FORMAT}") == []  # nothing written into theirs


@pytest.mark.skipif(not ROOT, reason="chgrp to another group needs root")
def test_a_folder_writable_by_another_group_is_not_used(cache, tmp_path, monkeypatch):
    above = tmp_path / "group"
    above.mkdir()
    os.chown(above, os.geteuid(), OTHER)
    os.chmod(above, 0o775)
    d, said = cache_in(above, monkeypatch)
    assert not d.startswith(str(above)) and any("writable by its group" in m for m in said), said
    os.chmod(above, 0o3775)  # sticky: fine again
    d, said = cache_in(above, monkeypatch)
    assert d.startswith(str(above)) and not said


# ------------------------------------------------------------------------------------------------
# the size cap and the temporary folders
# ------------------------------------------------------------------------------------------------
def test_least_recently_used_entries_go_first_with_their_siblings(cache, monkeypatch):
    d = ge_cache.cache_dir()
    t0 = time.time() - 1000
    for i in range(8):
        ge_cache.write_data(f"lru_{i}", bytes(10_000))
        for suffix in (".dat", ".sum"):
            os.utime(os.path.join(d, f"lru_{i}{suffix}"), (t0 + i, t0 + i))
    with open(os.path.join(d, "lru_0.c"), "w") as f:  # a sibling that goes with its entry
        f.write("x")
    ge_cache._state.pop("touched", None)
    assert ge_cache.read_data("lru_1") == bytes(10_000)  # a read makes lru_1 the most recent
    left = ge_cache.evict(d, cap=60_000)
    names = set(os.listdir(d))
    gone = [i for i in range(8) if f"lru_{i}.dat" not in names]
    assert gone == [0, 2, 3, 4], names  # oldest first, down to 3/4 of the cap; lru_1 was read
    assert "lru_0.c" not in names and "lru_0.sum" not in names
    assert all(f"lru_{i}.sum" in names for i in range(8) if i not in gone)
    assert left <= 45_000
    for i in range(8):
        assert ge_cache.read_data(f"lru_{i}") == (None if i in gone else bytes(10_000))


def test_writes_keep_the_folder_under_the_cap_without_scanning_each_time(cache, monkeypatch):
    monkeypatch.setenv("GE_CACHE_MAX_BYTES", "50K")
    assert ge_cache.max_bytes() == 50 * 1024
    scans = []
    real = ge_cache.evict
    monkeypatch.setattr(ge_cache, "evict", lambda *a, **k: scans.append(1) or real(*a, **k))
    for i in range(40):
        ge_cache.write_data(f"cap_{i}", bytes(4000))
    d = ge_cache.cache_dir()
    assert sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)) <= 50 * 1024
    assert 2 <= len(scans) <= 12, len(scans)  # the first write, then only when the estimate passes the cap
    assert ge_cache.read_data("cap_39") == bytes(4000)  # the newest stay
    monkeypatch.setenv("GE_CACHE_MAX_BYTES", "off")
    assert ge_cache.max_bytes() is None
    monkeypatch.setenv("GE_CACHE_MAX_BYTES", "2GiB")
    assert ge_cache.max_bytes() == 2 << 30


def test_an_evicted_kernel_is_built_again(cache, kit, monkeypatch):
    before = dict(native.stats())
    assert added(fresh_build(kit)) == GOOD
    d = ge_cache.cache_dir()
    ge_cache.evict(d, cap=1)
    assert not any(n.startswith(kit["modname"]) for n in os.listdir(d))
    mod = fresh_build(kit)
    assert added(mod) == GOOD
    assert native.stats()["compiled"] >= before["compiled"] + 2
    assert ge_cache.entry_ok(os.path.join(d, kit["modname"] + ".so"), os.path.join(d, kit["modname"] + ".sum"))


CHILD = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    from ge_core import cache
    d = cache.cache_dir()
    cache.write_data("child_probe", b"x")
    assert cache.read_data("child_probe") == b"x"
    print(d)
""")


def test_the_private_folder_is_removed_at_exit(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    env = {**os.environ, "GE_CACHE_DIR": str(shared / "cache"), "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120, check=True)
    d = r.stdout.strip()
    assert os.path.basename(d).startswith(ge_cache.FALLBACK_PREFIX) and d.startswith(str(tmp_path))
    assert not os.path.exists(d)


def test_stale_private_folders_of_dead_processes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    old = time.time() - 2 * ge_cache.STALE_FALLBACK_S
    made = {}
    for label, name, when in (("dead-old", f"{ge_cache.FALLBACK_PREFIX}{dead}-abc", old),
                              ("legacy-old", f"{ge_cache.FALLBACK_PREFIX}k2j4h5", old),
                              ("alive-old", f"{ge_cache.FALLBACK_PREFIX}{os.getpid()}-abc", old),
                              ("dead-new", f"{ge_cache.FALLBACK_PREFIX}{dead}-def", time.time()),
                              ("other", "not-ours-abc", old)):
        p = tmp_path / name
        p.mkdir()
        (p / "ge_x.so").write_bytes(b"x")
        os.utime(p, (when, when))
        made[label] = p
    assert ge_cache.remove_stale_fallbacks(now=time.time()) == 2
    assert {k for k, p in made.items() if p.exists()} == {"alive-old", "dead-new", "other"}
