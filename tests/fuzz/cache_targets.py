"""The "cache" fuzz target: races and damage in the user's cache folder (issue 42).

Each case damages the cache at random moments -- before the load, after an entry's ``.sum`` was
read, between a build's rename into the folder and its load, between an entry's check and its
load, inside the compiler's run -- by corrupting, truncating, deleting, swapping (an impostor
module with the same init name, alone or with a matching ``.sum``), linking, chmod-ing or
(as root) chown-ing the ``.so``, ``.sum``, ``.c`` and ``.dat`` files, the cache folder and the
folder above it, evicting entries and leaving temporary files; then loads kernels and reads data
entries. Every case must end in the real kernel (from the cache or rebuilt) or the NumPy form
after a clean warning, and a data entry read back must be the bytes written or absent.

Oracles: the bytes handed to the loader (``native._load``) are always exactly the real build of
that module (never an impostor, a damaged file or an unverified one), a module really loaded
computes the real kernel's results, and ``read_data`` never returns other bytes than were
written. A gcc run per case would be too slow: the kernels and their impostors are compiled
once in ``setup``; afterwards "the compiler" copies the real build of the module asked for
(``native.subprocess`` is replaced in the fuzzing child), and 2% of the loads are real
``dlopen`` s of the checked bytes (the others return the module loaded before, after the oracle
has seen the bytes).

A consistent pair of an impostor and its sum that *this user* put in the cache before a load is
trusted by design (the folder is the user's own); such pairs are only planted at moments after
the check (where they must have no effect) or owned by another user, and the start of each case
removes any left from the one before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import stat
import subprocess
import types
import warnings
from typing import Any

from fuzz_engine import OracleViolation, Target

OTHER = 12345
#: the share of loads that really dlopen (each maps a new copy of the module for the process's life)
REAL_LOADS = 0.02

_SRC = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native_canary.c"), encoding="ascii").read()
#: (real constant, impostor constant) of each kernel
_KERNELS = ((11.0, 1011.0), (13.0, 1013.0))
_DATA = {"fuzz_cache_a": b"payload-a" * 50, "fuzz_cache_b": bytes(range(256)) * 8}


def _read(path: str) -> bytes | None:
    """A regular file's bytes (None for anything else: never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _sum(data: bytes) -> bytes:
    return (hashlib.sha256(data).hexdigest() + "\n").encode()


class CacheTarget(Target):
    name = "cache"
    case_timeout = 20.0

    def warm_up(self) -> None:
        import numpy  # noqa: F401

        import ge_core.cache  # noqa: F401
        import ge_native.native  # noqa: F401

    # --------------------------------------------------------------------------------------------
    def setup(self, workdir: str) -> None:
        super().setup(workdir)
        from ge_core import cache
        from ge_native import native

        if not native.available():
            raise RuntimeError("the cache target needs a C compiler and Python/NumPy headers")
        self.cache, self.native = cache, native
        self.root = os.path.join(workdir, "home")  # the folder above the cache folder
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.environ["GE_CACHE_DIR"] = os.path.join(self.root, "cache")
        os.environ.pop("GE_CACHE_MAX_BYTES", None)
        self.d = os.path.join(os.path.realpath(self.root), "cache", f"v{cache.FORMAT}")
        self.store = os.path.join(workdir, "store")
        os.makedirs(self.store, exist_ok=True)
        self.root_user = os.geteuid() == 0
        self.kernels: list[dict[str, Any]] = []
        for good, evil in _KERNELS:
            src = _SRC.replace("ADDf", f"{good}f")
            full = src + native._module_table(["canary"])
            key = native.key_for(full)
            modname = f"ge_{key}"
            mod = native.build(src, ["canary"])  # the real build, by the real compiler
            assert mod is not None and self._added(mod) == good
            with open(os.path.join(self.d, modname + ".so"), "rb") as f:
                real = f.read()
            impostor = self._compile(modname, _SRC.replace("ADDf", f"{evil}f"))
            self.kernels.append({"src": src, "key": key, "modname": modname, "good": good, "real": real,
                                 "impostor": impostor, "module": mod})
        self.by_modname = {k["modname"]: k for k in self.kernels}
        # from now on "the compiler" copies the real build of the module asked for
        self.real_load = native._load
        self.real_read_sum = cache.read_sum
        native.subprocess = types.SimpleNamespace(run=self._fake_cc, SubprocessError=subprocess.SubprocessError)
        native._load = self._checked_load
        cache.read_sum = self._read_sum
        self.stage_mutations: dict[str, list[str]] = {}
        self.rng = random.Random(0)
        self.ctx: dict[str, Any] = {}

    def _compile(self, modname: str, src: str) -> bytes:
        native = self.native
        c = os.path.join(self.store, f"{modname}.{len(os.listdir(self.store))}.c")
        out = c[:-2] + ".so"
        with open(c, "w", encoding="ascii") as f:
            f.write(native.module_source(modname, src, ["canary"]))
        r = native.run_compiler(c, out)  # before the fuzzing child replaces native's compiler
        if r.returncode != 0:
            raise RuntimeError(f"the canary did not compile: {r.stderr[-2000:]}")
        with open(out, "rb") as f:
            return f.read()

    @staticmethod
    def _added(mod: Any) -> float:
        import numpy as np

        out = np.empty(2, np.float32)
        mod.canary(np.zeros(2, np.float32), out, 3.0)
        return float(out[0])

    # --------------------------------------------------------------------------------------------
    # the instrumented moments
    # --------------------------------------------------------------------------------------------
    def _fake_cc(self, cmd: list[str], **kw: Any) -> Any:
        out = cmd[cmd.index("-o") + 1]
        csrc = next(a for a in cmd if a.endswith(".c"))
        with open(csrc, encoding="ascii") as f:
            text = f.read()
        kernel = next((k for k in self.kernels if f"PyInit_{k['modname']}(" in text), None)
        if kernel is None or self.ctx.get("cc_fails"):
            return subprocess.CompletedProcess(cmd, 1, "", "error: the fuzzed compiler refused")
        with open(out, "wb") as f:
            f.write(kernel["real"])
        self._at("compile", out[:-3])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def _read_sum(self, total: str) -> str | None:
        want = self.real_read_sum(total)
        self._at("after_sum", total[:-4])
        return want

    def _hook(self, stage: str, so: str) -> None:
        self._at(stage, so[:-3])

    def _at(self, stage: str, stem: str) -> None:
        """Apply the mutations planned for ``stage`` (once each), to the cache folder under test
        only (never to a private fallback folder, whose parent is the system's temporary folder).
        Inside the compiler's run only what another user could do: the output's content is what
        this user's compiler wrote (trusted); links, removals, foreign files and folder changes."""
        if not stem.startswith(self.d + os.sep):
            return
        for m in self.stage_mutations.pop(stage, []):
            if stage == "compile" and m not in self._COMPILE:
                m = self.rng.choice(self._COMPILE)
            self._mutate(m, stem, self.rng, late=True)
            self.ctx["raced"] = True

    def _checked_load(self, modname: str, so: str, data: bytes) -> Any:
        k = self.by_modname.get(modname)
        if k is None:  # the native pool or another module: not fuzzed
            return self.real_load(modname, so, data)
        if data != k["real"]:
            what = "an impostor" if data == k["impostor"] else f"{len(data)} bytes that are not its build"
            raise OracleViolation(f"the loader was handed {what} for {modname} ({self.ctx.get('mutation')})")
        if self.rng.random() < REAL_LOADS:
            mod = self.real_load(modname, so, data)
            self.ctx["real_loads"] = self.ctx.get("real_loads", 0) + 1
            return mod
        return k["module"]

    # --------------------------------------------------------------------------------------------
    # mutations
    # --------------------------------------------------------------------------------------------
    def _mutate(self, m: str, stem: str, rng: random.Random, *, late: bool) -> None:
        """One change to the entry ``stem`` (path without suffix) or its folders. ``late``: the
        moment is after the check (a consistent pair of this user's may then be planted too)."""
        d = os.path.dirname(stem)
        so = stem + (".dat" if os.path.basename(stem).startswith("fuzz_cache_") else ".so")
        total = stem + ".sum"
        kernel = self.by_modname.get(os.path.basename(stem))
        impostor = kernel["impostor"] if kernel else b"not the payload"
        try:
            if m == "corrupt":
                if _read(so) is None:
                    return
                with open(so, "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size:
                        f.seek(rng.randrange(size))
                        b = f.read(1)
                        f.seek(-1, os.SEEK_CUR)
                        f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
            elif m == "truncate":
                if _read(so) is None:
                    return
                os.truncate(so, rng.randrange(max(1, os.path.getsize(so))))
            elif m == "impostor":  # an impostor with the old sum
                self._put(so, impostor)
            elif m == "impostor_foreign" and self.root_user:  # another user's file, old sum
                self._put(so, impostor, owner=OTHER)
            elif m == "impostor_pair" and late:  # an impostor with its own sum, after the check
                self._put(so, impostor)
                self._put(total, _sum(impostor))
            elif m == "impostor_pair_foreign" and self.root_user:
                self._put(so, impostor, owner=OTHER)
                self._put(total, _sum(impostor), owner=OTHER)
            elif m == "open_to_all":  # a pair writable by everyone
                self._put(so, impostor, mode=0o666)
                self._put(total, _sum(impostor), mode=0o666)
            elif m == "link":  # a link to a file of the real bytes, the real sum beside it
                real = kernel["real"] if kernel else _DATA.get(os.path.basename(stem), b"")
                target = os.path.join(self.store, f"real-{os.path.basename(stem)}")
                with open(target, "wb") as f:
                    f.write(real)
                for p in (so, total):
                    self._remove(p)
                os.symlink(target, so)
                self._put(total, _sum(real))
            elif m == "link_sum":
                s = os.path.join(self.store, "sum-elsewhere")
                with open(s, "wb") as f:
                    f.write(_sum(impostor))
                self._put(so, impostor)
                self._remove(total)
                os.symlink(s, total)
            elif m == "bad_sum":
                self._put(total, rng.choice([b"", b"zz" * 32, b"0" * 63, _sum(b"x") * 3, b"\xff\xfe" * 40,
                                             _sum(impostor)[:-5]]))
            elif m == "delete":
                self._remove(rng.choice([so, total, stem + ".c"]))
            elif m == "fifo":
                p = rng.choice([so, total])
                self._remove(p)
                os.mkfifo(p, 0o600)
            elif m == "folder_in_place":
                p = rng.choice([so, total])
                self._remove(p)
                os.mkdir(p, 0o700)
            elif m == "chmod_folder":
                os.chmod(d, rng.choice([0o777, 0o755, 0o770, 0o1777]))
            elif m == "open_parent":  # another user could now swap the cache folder
                os.chmod(os.path.dirname(d), rng.choice([0o777, 0o757]))
            elif m == "swap_folder":  # ... and does: a folder of planted entries in its place
                parent = os.path.dirname(d)
                os.chmod(parent, 0o777)
                aside = d + ".aside"
                shutil.rmtree(aside, ignore_errors=True)
                os.rename(d, aside)
                os.mkdir(d, 0o700)
                if self.root_user:  # the other user's own files (a non-root run cannot make any)
                    os.chown(d, OTHER, OTHER)
                    for k in self.kernels:
                        self._put(os.path.join(d, k["modname"] + ".so"), k["impostor"], owner=OTHER)
                        self._put(os.path.join(d, k["modname"] + ".sum"), _sum(k["impostor"]), owner=OTHER)
            elif m == "foreign_folder" and self.root_user:
                os.chown(d, OTHER, OTHER)
            elif m == "foreign_parent" and self.root_user:
                os.chown(os.path.dirname(d), OTHER, OTHER)
            elif m == "remove_folder":
                shutil.rmtree(d, ignore_errors=True)
            elif m == "evict":
                self.cache.evict(d, cap=rng.choice([0, 1, 20_000, 100_000]))
            elif m == "stale_temp":
                p = os.path.join(d, f".{os.path.basename(stem)}.junk{rng.randrange(1000)}.so")
                with open(p, "wb") as f:
                    f.write(impostor[: rng.randrange(1, 200)])
                old = rng.choice([0, 10 ** 9])
                os.utime(p, (old, old) if old else None)
        except OSError:
            pass  # the thing to damage was not there (an earlier mutation removed it)

    def _put(self, path: str, data: bytes, *, owner: int | None = None, mode: int = 0o600) -> None:
        self._remove(path)
        tmp = path + ".fuzz-tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, owner, owner)
        os.replace(tmp, path)

    @staticmethod
    def _remove(path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)

    # --------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        """Undo what the last case left that this user would not have done: folders' owners and
        modes, a swapped or missing folder, impostor pairs of this user's (trusted by design)."""
        parent = os.path.dirname(self.d)
        for p, mode in ((self.root, 0o700), (parent, 0o700)):
            if self.root_user:
                os.chown(p, 0, 0)
            os.chmod(p, mode)
        aside = self.d + ".aside"
        if os.path.lexists(aside):
            self._remove(self.d)
            os.rename(aside, self.d)
        if not os.path.isdir(self.d) or os.path.islink(self.d):
            self._remove(self.d)
            os.mkdir(self.d, 0o700)
        if self.root_user:
            os.chown(self.d, 0, 0)
        os.chmod(self.d, 0o700)
        for k in self.kernels:
            so = os.path.join(self.d, k["modname"] + ".so")
            if _read(so) == k["impostor"] or _read(so[:-3] + ".sum") == _sum(k["impostor"]):
                self._remove(so)
                self._remove(so[:-3] + ".sum")
        for name, payload in _DATA.items():
            p = os.path.join(self.d, name + ".dat")
            if os.path.lexists(p) and _read(p) != payload:
                self._remove(p)
                self._remove(p[:-4] + ".sum")

    _EARLY = ["corrupt", "truncate", "impostor", "impostor_foreign", "impostor_pair_foreign", "open_to_all", "link", "link_sum",
              "bad_sum", "delete", "fifo", "folder_in_place", "chmod_folder", "open_parent", "swap_folder",
              "foreign_folder", "foreign_parent", "remove_folder", "evict", "stale_temp"]
    _LATE = _EARLY + ["impostor_pair", "impostor_pair", "impostor_pair"]
    _STAGES = ["cached", "built", "after_sum", "compile"]
    _COMPILE = ["delete", "fifo", "folder_in_place", "link", "impostor_foreign", "chmod_folder", "open_parent",
                "swap_folder", "foreign_folder", "foreign_parent", "remove_folder", "evict", "stale_temp"]

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        from ge_core import cache

        native = self.native
        self._reset()
        self.rng, self.ctx = rng, ctx
        native._modules.pop(self.kernels[0]["key"], None)
        native._modules.pop(self.kernels[1]["key"], None)
        cache._state.pop("touched", None)
        if rng.random() < 0.2:
            os.environ["GE_CACHE_MAX_BYTES"] = rng.choice(["1", "30K", "200K", "off"])
        else:
            os.environ.pop("GE_CACHE_MAX_BYTES", None)
        ctx["cc_fails"] = rng.random() < 0.03
        early = [rng.choice(self._EARLY) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
        self.stage_mutations = {}
        for _ in range(rng.choice((0, 1, 1, 2))):
            self.stage_mutations.setdefault(rng.choice(self._STAGES), []).append(rng.choice(self._LATE))
        targets = [k["modname"] for k in self.kernels] + list(_DATA)
        stem = os.path.join(self.d, rng.choice(targets))
        first = early[0] if early else "late" if self.stage_mutations else "none"
        ctx["mutation"] = f"{first}:" + "+".join(early) + "|" + ",".join(
            f"{s}={'+'.join(ms)}" for s, ms in sorted(self.stage_mutations.items()))
        for m in early:
            self._mutate(m, stem, rng, late=False)
        native.before_load = self._hook
        labels = []
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                for k in rng.sample(self.kernels, rng.choice((1, 2))):
                    before = dict(native.stats())
                    mod = native.build(k["src"], ["canary"])
                    if mod is None:
                        labels.append("numpy")  # the caller's NumPy form runs (after a warning)
                        continue
                    got = self._added(mod)
                    if got != k["good"]:
                        raise OracleViolation(f"{k['modname']} adds {got}, not {k['good']} ({ctx['mutation']})")
                    after = native.stats()
                    labels.append("compiled" if after["compiled"] > before["compiled"] else
                                  "rebuilt" if after["rebuilt"] > before["rebuilt"] else "cached")
                for name in rng.sample(list(_DATA), rng.choice((0, 1))):
                    got_data = cache.read_data(name)
                    if got_data is not None and got_data != _DATA[name]:
                        raise OracleViolation(f"read_data({name!r}) gave {len(got_data)} bytes that were never "
                                              f"written ({ctx['mutation']})")
                    if got_data is None:
                        cache.write_data(name, _DATA[name])
                        labels.append("data-rewritten")
                    else:
                        labels.append("data")
        finally:
            native.before_load = None
            self.stage_mutations = {}
        if ctx.get("real_loads"):
            labels.append("dlopen")
        if ctx.get("raced"):
            labels.append("raced")  # a mutation fired between a check or a build and the load
        return "+".join(sorted(set(labels))) or "ok"
