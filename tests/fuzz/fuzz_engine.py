"""A small, dependency-free fuzzing engine: seeded mutation of valid seeds, one case at a time.

Every case is reproducible from ``(target, seed, index)``: case ``i`` draws all its randomness
from ``random.Random(f"{seed}:{i}")``. A case ends in one of:

* ``ok`` (the reader returned a result) or the name of the :class:`~ge_core.GEError` subclass it
  raised -- both are fine;
* a *crash*: any other exception, a :class:`~ge_core.GEError` caused by a ``MemoryError`` (a
  blow-up hidden behind a clean message), a case over the per-case time limit (a hang), a broken
  target-specific oracle (e.g. external data read from outside the model's folder), or a
  process-level failure (segfault, out of memory) seen by the subprocess driver.

:func:`run_campaign` runs a target in this process; :func:`run_in_subprocess` runs it in a child
with ``RLIMIT_AS`` set, so that an attempt to allocate far more than the file could hold fails
loudly instead of swapping, and a segfault or C-level hang is caught from outside. The child
is this file run as a script (``python fuzz_engine.py --target onnx ...``), so the tests and
``scripts/fuzz.py`` share one code path.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

#: Default address-space cap of a fuzzing child (bytes). Models are a few KiB; anything that
#: needs more than this is allocating from a hostile size field.
DEFAULT_MEM_LIMIT = 3 << 30


class CaseTimeout(BaseException):
    """Raised by the per-case alarm; a BaseException so ``except Exception`` cannot swallow it."""


class OracleViolation(Exception):
    """A target-specific check failed (e.g. a read outside the model's folder succeeded)."""


@dataclass
class Crash:
    index: int
    kind: str  # exception | memory | hang | oracle | process
    error: str
    message: str
    trace: str = ""
    mutation: str = ""
    input_file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Stats:
    target: str
    seed: int
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    deep: Counter = field(default_factory=Counter)  # e.g. compiled / ran: how far ok cases got
    mutations: Counter = field(default_factory=Counter)
    crashes: list[Crash] = field(default_factory=list)
    #: first message of each "GEError wrapping an internal exception" outcome
    wrapped: dict[str, str] = field(default_factory=dict)
    max_rss_mb: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "seed": self.seed,
            "cases": self.cases,
            "seconds": round(self.seconds, 2),
            "outcomes": dict(self.outcomes.most_common()),
            "deep": dict(self.deep.most_common()),
            "mutations": dict(self.mutations.most_common()),
            "crashes": [c.as_dict() for c in self.crashes],
            "wrapped": dict(self.wrapped),
            "max_rss_mb": round(self.max_rss_mb, 1),
        }


class Target:
    """One reader under test. Subclasses make seeds in ``setup`` and implement ``case``."""

    name = ""
    #: wall-clock seconds one case may take before it counts as a hang
    case_timeout = 10.0
    #: cap the child's address space at what it maps after ``warm_up`` plus the limit (for
    #: frameworks that reserve gigabytes on import), not at the limit alone
    mem_limit_relative = False

    def setup(self, workdir: str) -> None:
        self.workdir = workdir

    def case(self, rng: random.Random, index: int, ctx: dict[str, Any]) -> str:
        """Make one input, feed it to the reader; return an outcome label ("ok", "ok:compiled").

        Record the mutation applied in ``ctx["mutation"]`` and the raw input in ``ctx["input"]``
        (bytes) so a crash can be reproduced. GEErrors propagate to the engine.
        """
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------
# byte-level mutation, shared by the targets
# ------------------------------------------------------------------------------------------------
INTERESTING_INTS = [0, 1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535, 65536,
                    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**48, 2**62, 2**63 - 1]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mutate_bytes(data: bytes, rng: random.Random, others: list[bytes] = (), rounds: int | None = None) -> tuple[bytes, str]:  # type: ignore[assignment]
    """Apply 1..8 byte-level edits to ``data``; returns the result and a short description."""
    buf = bytearray(data)
    ops = []
    for _ in range(rounds or rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
        op = rng.randrange(11)
        n = len(buf)
        if op == 0 and n:  # flip one bit
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
            ops.append("bitflip")
        elif op == 1 and n:  # set a byte
            buf[rng.randrange(n)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
            ops.append("byte")
        elif op == 2 and n:  # overwrite with a varint of an interesting value
            i = rng.randrange(n)
            v = _varint(rng.choice(INTERESTING_INTS) * rng.choice((1, 1, -1)))
            buf[i : i + len(v)] = v
            ops.append("varint")
        elif op == 3 and n:  # overwrite 2/4/8 bytes little-endian with an interesting value
            width = rng.choice((2, 4, 8))
            i = rng.randrange(n)
            v = (rng.choice(INTERESTING_INTS) & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
            buf[i : i + width] = v
            ops.append(f"int{8 * width}")
        elif op == 4 and n:  # delete a range
            i = rng.randrange(n)
            del buf[i : i + rng.choice((1, 2, 4, 16, 64, 1024))]
            ops.append("delete")
        elif op == 5:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 16))))
            ops.append("insert")
        elif op == 6 and n:  # duplicate a range
            i = rng.randrange(n)
            j = min(n, i + rng.choice((1, 8, 64, 512)))
            k = rng.randrange(n + 1)
            buf[k:k] = buf[i:j]
            ops.append("duplicate")
        elif op == 7 and n:  # truncate
            del buf[rng.randrange(n) :]
            ops.append("truncate")
        elif op == 8 and others:  # splice with another seed
            o = rng.choice(others)
            if o:
                i, j = rng.randrange(n + 1), rng.randrange(len(o))
                buf = buf[:i] + bytearray(o[j:])
                ops.append("splice")
        elif op == 9 and n > 1:  # swap two ranges of one byte..16 bytes
            a, b = sorted(rng.randrange(n) for _ in range(2))
            w = min(rng.choice((1, 4, 16)), b - a)
            buf[a : a + w], buf[b : b + w] = buf[b : b + w], buf[a : a + w]
            ops.append("swap")
        elif op == 10 and n:  # fill a range with one value
            i = rng.randrange(n)
            w = rng.choice((2, 8, 32))
            buf[i : i + w] = bytes([rng.choice((0, 0xFF))]) * len(buf[i : i + w])
            ops.append("fill")
    return bytes(buf), "bytes:" + "+".join(ops)


# ------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------
def _caused_by_memory_error(e: BaseException) -> bool:
    seen = 0
    x: BaseException | None = e
    while x is not None and seen < 20:
        if isinstance(x, MemoryError):
            return True
        x = x.__cause__ or x.__context__
        seen += 1
    return False


def _alarm(signum, frame):  # pragma: no cover - timing dependent
    raise CaseTimeout()


def run_campaign(
    target: Target,
    *,
    cases: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    start: int = 0,
    workdir: str | None = None,
    crash_dir: str | None = None,
    progress: Callable[[int], None] | None = None,
    snapshot: Callable[[Stats], None] | None = None,
    max_crashes: int = 20,
) -> Stats:
    """Run ``target`` for ``cases`` cases and/or ``seconds`` seconds; never raises for a case.

    ``progress(i)`` hears the index of each case before it runs, ``snapshot(stats)`` the figures
    so far (so that a driver can report the cases before one that killed the process).
    """
    from ge_core.errors import GEError

    if cases is None and seconds is None:
        cases = 1000
    own_tmp = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix=f"gefuzz-{target.name}-")
        workdir = own_tmp.name
    target.setup(workdir)
    stats = Stats(target.name, seed)
    use_alarm = hasattr(signal, "setitimer") and _main_thread()
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    t0 = time.perf_counter()
    i = start
    try:
        while True:
            if cases is not None and stats.cases >= cases:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            if snapshot is not None:
                stats.seconds = time.perf_counter() - t0
                snapshot(stats)
            if progress is not None:
                progress(i)
            rng = random.Random(f"{seed}:{i}")
            ctx: dict[str, Any] = {"mutation": "", "input": None}
            crash: Crash | None = None
            try:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, target.case_timeout)
                try:
                    label = target.case(rng, i, ctx)
                finally:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                stats.outcomes["ok"] += 1
                if label != "ok":
                    stats.deep[label] += 1
            except GEError as e:
                if _caused_by_memory_error(e):
                    crash = Crash(i, "memory", type(e).__name__, str(e)[:500], traceback.format_exc()[-3000:])
                else:
                    label = type(e).__name__
                    cause = e.__cause__
                    if cause is not None and not isinstance(cause, GEError):
                        # a clean error, but one that wraps an internal exception: worth a look
                        label += f"<-{type(cause).__name__}"
                        stats.wrapped.setdefault(label, f"case {i}: {str(e)[:300]}")
                    stats.outcomes[label] += 1
            except CaseTimeout:
                crash = Crash(i, "hang", "CaseTimeout", f"case took more than {target.case_timeout}s",
                              traceback.format_exc()[-3000:])
            except OracleViolation as e:
                crash = Crash(i, "oracle", "OracleViolation", str(e)[:500])
            except MemoryError as e:
                crash = Crash(i, "memory", "MemoryError", str(e)[:500], traceback.format_exc()[-3000:])
            except Exception as e:  # noqa: BLE001 - the point of fuzzing
                crash = Crash(i, "exception", type(e).__name__, str(e)[:500], traceback.format_exc()[-3000:])
            stats.mutations[ctx["mutation"].split(":")[0] or "?"] += 1
            stats.cases += 1
            if crash is not None:
                crash.mutation = ctx["mutation"]
                stats.outcomes["CRASH"] += 1
                if len(stats.crashes) < max_crashes:
                    if crash_dir and ctx.get("input") is not None:
                        os.makedirs(crash_dir, exist_ok=True)
                        p = os.path.join(crash_dir, f"{target.name}-{seed}-{i}.bin")
                        with open(p, "wb") as f:
                            f.write(ctx["input"])
                        crash.input_file = p
                    stats.crashes.append(crash)
            i += 1
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        stats.seconds = time.perf_counter() - t0
        stats.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if own_tmp is not None:
            own_tmp.cleanup()
    return stats


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def get_target(name: str) -> Target:
    sys.path.insert(0, HERE)
    import fuzz_targets

    try:
        cls = fuzz_targets.TARGETS[name]
    except KeyError:
        raise SystemExit(f"unknown target {name!r}; targets: {', '.join(fuzz_targets.TARGETS)}") from None
    return cls()


def run_in_subprocess(
    name: str,
    *,
    cases: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    start: int = 0,
    mem_limit: int | None = DEFAULT_MEM_LIMIT,
    timeout: float = 600,
    crash_dir: str | None = None,
    workdir: str | None = None,
) -> dict[str, Any]:
    """Run one target in a child process under ``RLIMIT_AS``; returns the stats as a dict.

    A child that dies (signal, out of memory) or outlives ``timeout`` is reported as a
    ``process`` crash at the case it was working on (read from its progress file).
    """
    with tempfile.TemporaryDirectory(prefix=f"gefuzz-{name}-") as tmp:
        progress = os.path.join(tmp, "progress")
        out = os.path.join(tmp, "stats.json")
        cmd = [sys.executable, os.path.join(HERE, "fuzz_engine.py"), "--target", name, "--seed", str(seed),
               "--start", str(start), "--json-out", out, "--progress-file", progress]
        if cases is not None:
            cmd += ["--cases", str(cases)]
        if seconds is not None:
            cmd += ["--seconds", str(seconds)]
        if mem_limit:
            cmd += ["--mem-limit", str(mem_limit)]
        if crash_dir:
            cmd += ["--crash-dir", crash_dir]
        cmd += ["--workdir", workdir or os.path.join(tmp, "work")]
        env = dict(os.environ)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = None, (e.stderr or b"").decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        if rc == 0 and os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                return json.load(f)
        at = -1
        with contextlib.suppress(OSError, ValueError):
            with open(progress, encoding="ascii") as f:
                at = int(f.read().strip() or -1)
        what = "timed out" if rc is None else f"exited with status {rc}"
        died = Crash(at, "process", "ProcessDied", f"the fuzzing child {what} at case {at}", (err or "")[-3000:])
        try:  # the figures of the cases before the one that killed it
            with open(progress + ".stats", encoding="utf-8") as f:
                partial = json.load(f)
        except (OSError, ValueError):
            partial = {"target": name, "seed": seed, "cases": max(at - start, 0), "seconds": None, "outcomes": {},
                       "deep": {}, "mutations": {}, "crashes": []}
        partial["outcomes"]["CRASH"] = partial["outcomes"].get("CRASH", 0) + 1
        partial["crashes"].append(died.as_dict())
        partial["cases"] += 1  # the case that killed it
        return partial


def format_stats(s: dict[str, Any]) -> str:
    """One human-readable block of figures for a target."""
    lines = [f"target {s['target']}: {s['cases']} cases in {s['seconds']} s (seed {s['seed']}), "
             f"crashes {len(s['crashes'])}, max RSS {s.get('max_rss_mb', '?')} MiB"]
    lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items()))
    if s.get("deep"):
        lines.append("  ok cases that went further: " + ", ".join(f"{k} {v}" for k, v in s["deep"].items()))
    if s.get("mutations"):
        lines.append("  mutations: " + ", ".join(f"{k} {v}" for k, v in s["mutations"].items()))
    for label, msg in (s.get("wrapped") or {}).items():
        lines.append(f"  wrapped internal error {label}: {msg}")
    for c in s["crashes"]:
        lines.append(f"  CRASH case {c['index']} [{c['kind']}] {c['error']}: {c['message'][:300]} "
                     f"(mutation {c['mutation']}; input {c.get('input_file')})")
        if c.get("trace"):
            lines.append("    " + c["trace"].strip().replace("\n", "\n    ")[-1500:])
    return "\n".join(lines)


def _address_space() -> int:
    """Bytes of address space this process maps now (0 where /proc is not there)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    return 0


def _child_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--cases", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--mem-limit", type=int)
    ap.add_argument("--json-out")
    ap.add_argument("--progress-file")
    ap.add_argument("--crash-dir")
    ap.add_argument("--workdir")
    ap.add_argument("--show-input", action="store_true", help="print the base64 input of each crash")
    a = ap.parse_args(argv)
    target = get_target(a.target)
    # Import the heavy modules and load the plugins before the cap: the cap is for the cases.
    target.warm_up()  # type: ignore[attr-defined]
    if a.mem_limit:
        limit = a.mem_limit
        if getattr(target, "mem_limit_relative", False):
            limit += _address_space()  # a framework that maps gigabytes up front (TensorFlow)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    progress = snapshot = None
    if a.progress_file:
        pf = a.progress_file

        def progress(i: int) -> None:
            with open(pf, "w", encoding="ascii") as f:
                f.write(str(i))

        def snapshot(stats: Stats) -> None:
            with open(pf + ".stats.tmp", "w", encoding="utf-8") as f:
                json.dump(stats.as_dict(), f)
            os.replace(pf + ".stats.tmp", pf + ".stats")

    workdir = a.workdir
    if workdir:
        os.makedirs(workdir, exist_ok=True)
    stats = run_campaign(target, cases=a.cases, seconds=a.seconds, seed=a.seed, start=a.start,
                         workdir=workdir, crash_dir=a.crash_dir, progress=progress, snapshot=snapshot)
    d = stats.as_dict()
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(d, f)
    else:
        print(format_stats(d))
        if a.show_input:
            for c in d["crashes"]:
                if c.get("input_file"):
                    with open(c["input_file"], "rb") as fh:
                        print(c["index"], base64.b64encode(fh.read()).decode())
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
