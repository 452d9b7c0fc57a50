#!/usr/bin/env python3
"""Mutation testing: proves that the test suite catches bugs in the core behaviours.

    make mutants                                  # every mutation in tools/mutants.toml
    python tools/mutants.py --list                # what the mutations are
    python tools/mutants.py ring-seg-off-by-one   # a subset, by id (or prefix*)

Each mutation in tools/mutants.toml replaces one exact snippet of one line of
one source file, and names the tests that must fail because of it (a C++ test
binary such as `test_engine`, or a pytest node id such as
`tests/test_errors.py::test_x`). The script

  1. checks that every snippet occurs exactly once in its file (a snippet
     starting with white space only at the start of a line), and stops before
     anything else if one does not (the list cannot rot silently);
  2. copies the tracked (and untracked, not ignored) files into a scratch tree
     (default build/mutants/tree0) and builds it there once, in the scratch
     tree's own build directory (ccache makes the first build cheap);
  3. runs every listed test once on the unmutated scratch tree (the baseline:
     a test that fails anyway proves nothing);
  4. for each mutation: applies it, rebuilds incrementally what it touches
     (csrc/core: the listed C++ test binaries, and the extension when pytest
     tests are listed; csrc/torch: the extension through setup.py; Python: no
     build), runs the listed tests in order until one fails, and reverts;
  5. prints a table and exits 1 if any mutation survived, did not build, or
     could not be judged (a test error), 0 when every one was killed.

Results: killed (a listed test failed), timeout (a listed test did not finish
within the mutation's time budget: the hang was noticed, but only by this
script's deadline), SURVIVED (every listed test passed), build-broken.

The shared virtualenv is used as is (VENV, default <repo>/.venv); builds and
tests run under `nice`. Logs of every mutation are kept in <scratch>/logs/.
"""

import argparse
import fnmatch
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

try:
    import tomllib
except ImportError:  # Python < 3.11
    try:
        import tomli as tomllib  # type: ignore
    except ImportError:
        sys.exit("mutants: needs Python 3.11+ (tomllib) or the tomli package to read tools/mutants.toml")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIST = os.path.join(ROOT, "tools", "mutants.toml")
DEFAULT_SCRATCH = os.path.join(ROOT, "build", "mutants")
CTEST_NAME = re.compile(r"^test_\w+$")
CPP_SUFFIXES = (".cc", ".cpp", ".h")


@dataclass
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    what: str
    tests: List[str]
    timeout: Optional[float] = None

    @property
    def kind(self) -> str:
        if self.file.startswith("csrc/core/"):
            return "core"
        if self.file.startswith("csrc/torch/"):
            return "torch"
        return "python"

    def ctests(self) -> List[str]:
        return [t for t in self.tests if is_ctest(t)]

    def pytests(self) -> List[str]:
        return [t for t in self.tests if not is_ctest(t)]


@dataclass
class Outcome:
    mutant: Mutant
    status: str = "?"  # killed | timeout | SURVIVED | build-broken | error
    by: str = ""  # the test that killed it, or why it could not be judged
    seconds: float = 0.0


@dataclass
class RunResult:
    status: str  # pass | fail | timeout | error
    output: str
    seconds: float


def is_ctest(test: str) -> bool:
    return bool(CTEST_NAME.match(test))


def locate(text: str, find: str) -> List[int]:
    """Where `find` occurs in `text`. A snippet that starts with white space
    matches only at the start of a line, so its indentation tells apart the
    same statement at different depths."""
    at, out = text.find(find), []
    while at >= 0:
        if not find[:1].isspace() or at == 0 or text[at - 1] == "\n":
            out.append(at)
        at = text.find(find, at + 1)
    return out


# ---- the list ----------------------------------------------------------------


def load_mutants(path: str) -> List[Mutant]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = []
    for i, m in enumerate(data.get("mutant", [])):
        missing = [k for k in ("id", "file", "find", "replace", "what", "tests") if k not in m]
        if missing:
            raise SystemExit(f"mutants: entry {i} ({m.get('id', '?')}) of {path} lacks {', '.join(missing)}")
        out.append(
            Mutant(
                id=m["id"],
                file=m["file"],
                find=m["find"],
                replace=m["replace"],
                what=m["what"],
                tests=list(m["tests"]),
                timeout=m.get("timeout"),
            )
        )
    return out


def problems_of(mutants: Sequence[Mutant], root: str) -> List[str]:
    """Everything wrong with the list against the sources in `root`."""
    errors = []
    seen = set()
    for m in mutants:
        where = f"{m.id} ({m.file})"
        if m.id in seen:
            errors.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        if "\n" in m.find or "\n" in m.replace:
            errors.append(f"{where}: find/replace must be one line")
        if m.find == m.replace:
            errors.append(f"{where}: replacement equals the original")
        if not m.tests:
            errors.append(f"{where}: no tests listed")
        for t in m.tests:
            if is_ctest(t):
                if not os.path.exists(os.path.join(root, "csrc", "tests", t + ".cc")):
                    errors.append(f"{where}: no C++ test csrc/tests/{t}.cc")
                if m.kind != "core":
                    errors.append(f"{where}: C++ test {t} cannot see a change outside csrc/core")
            elif not os.path.exists(os.path.join(root, t.split("::")[0])):
                errors.append(f"{where}: no pytest file {t.split('::')[0]}")
        path = os.path.join(root, m.file)
        if not os.path.exists(path):
            errors.append(f"{where}: file does not exist")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        n = len(locate(text, m.find))
        if n != 1:
            errors.append(f"{where}: the snippet occurs {n} times (must be exactly once): {m.find!r}")
    return errors


def select(mutants: Sequence[Mutant], patterns: Sequence[str]) -> List[Mutant]:
    if not patterns:
        return list(mutants)
    chosen = [m for m in mutants if any(fnmatch.fnmatchcase(m.id, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(m.id, p) for m in mutants)]
    if unknown:
        raise SystemExit(f"mutants: no mutation matches {', '.join(unknown)} (see --list)")
    return chosen


# ---- processes -----------------------------------------------------------------


def _children() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def kill_tree(pid: int) -> None:
    """SIGKILLs `pid` and everything it started (rank processes run in their
    own sessions, so a process-group kill would miss them)."""
    kids = _children()
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(kids.get(p, []))
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Processes running now, so that an interrupted run can stop them.
_live: Dict[int, subprocess.Popen] = {}
_live_lock = threading.Lock()
_stopping = threading.Event()


def stop_everything() -> None:
    _stopping.set()
    with _live_lock:
        pids = list(_live)
    for pid in pids:
        kill_tree(pid)


def run(cmd: Sequence[str], cwd: str, env: Dict[str, str], timeout: float) -> RunResult:
    t0 = time.monotonic()
    with _live_lock:
        if _stopping.is_set():
            return RunResult("error", "interrupted\n", 0.0)
        proc = subprocess.Popen(
            ["nice", "-n", "10", *cmd],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _live[proc.pid] = proc
    chunks: List[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(65536), b"")), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(timeout, 1.0))
        status = "pass" if proc.returncode == 0 else "fail"
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
        status = "timeout"
    except BaseException:  # interrupted: leave nothing running
        kill_tree(proc.pid)
        proc.wait()
        raise
    reader.join(timeout=10)
    with _live_lock:
        _live.pop(proc.pid, None)
    if _stopping.is_set():
        status = "error"
    out = b"".join(chunks).decode(errors="replace")
    return RunResult(status, out + f"\n[exit {proc.returncode}]\n", time.monotonic() - t0)


# ---- one scratch tree ------------------------------------------------------------


class Tree:
    """A copy of the repository with its own build directory."""

    def __init__(self, path: str, python: str, jobs: str):
        self.path = path
        self.python = python
        self.jobs = jobs
        self.build_dir = os.path.join(path, "build", "cmake")
        # The extension in hvdtorch/ was built from mutated sources and must
        # be rebuilt before a test imports it again.
        self.extension_dirty = False

    def env(self) -> Dict[str, str]:
        e = dict(os.environ)
        e.update(
            {
                "PYTHONPATH": self.path,
                "PYTHONDONTWRITEBYTECODE": "1",  # a same-size mutation within one second would reuse a stale .pyc
                "HVDTORCH_BUILD_DIR": self.build_dir,
                "HVDTORCH_BUILD_TESTS": "1",  # the C++ test binaries the mutations name
                "MAX_JOBS": self.jobs,
                "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            }
        )
        return e

    def sync(self, files: Sequence[str]) -> None:
        """Makes the tree hold exactly `files` as in the repository. Files whose
        content is unchanged keep their time stamps, so rebuilds stay incremental."""
        manifest = os.path.join(self.path, ".mutants-manifest")
        old = set()
        if os.path.exists(manifest):
            with open(manifest) as f:
                old = set(f.read().split("\0")) - {""}
        for rel in files:
            src, dst = os.path.join(ROOT, rel), os.path.join(self.path, rel)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            with open(src, "rb") as f:
                data = f.read()
            if os.path.exists(dst):
                with open(dst, "rb") as f:
                    if f.read() == data:
                        continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(data)
            shutil.copymode(src, dst)
        for rel in old - set(files):
            try:
                os.remove(os.path.join(self.path, rel))
            except FileNotFoundError:
                pass
        with open(manifest, "w") as f:
            f.write("\0".join(files))
        for dirpath, dirnames, _ in os.walk(self.path):
            if "__pycache__" in dirnames:
                shutil.rmtree(os.path.join(dirpath, "__pycache__"))
            dirnames[:] = [d for d in dirnames if d not in ("build", ".git")]

    def build_extension(self, timeout: float) -> RunResult:
        r = run([self.python, "setup.py", "-q", "build_ext", "--inplace"], self.path, self.env(), timeout)
        if r.status == "pass":
            self.extension_dirty = False
        return r

    def build_ctests(self, names: Sequence[str], timeout: float) -> RunResult:
        return run(
            ["cmake", "--build", self.build_dir, "--target", *names, "--", "-j" + self.jobs],
            self.path,
            self.env(),
            timeout,
        )

    def run_test(self, test: str, timeout: float) -> RunResult:
        if is_ctest(test):
            return run([os.path.join(self.build_dir, test)], self.build_dir, self.env(), timeout)
        r = run(
            [self.python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test], self.path, self.env(), timeout
        )
        # 3: internal error, 4: usage error, 5: nothing collected: the list is wrong, not the code.
        m = re.search(r"\[exit (\d+)\]\n$", r.output)
        if r.status == "fail" and m and int(m.group(1)) in (3, 4, 5):
            r.status = "error"
        return r

    def prepare(self, mutant: Optional[Mutant], timeout: float) -> RunResult:
        """Brings what `mutant`'s tests run up to date with the tree's sources
        (mutant None: the tests of the baseline)."""
        kind = mutant.kind if mutant else "none"
        tests = mutant.tests if mutant else []
        log, t0 = "", time.monotonic()
        if kind == "python":
            path = os.path.join(self.path, mutant.file)
            try:
                with open(path, encoding="utf-8") as f:
                    compile(f.read(), path, "exec")
            except SyntaxError as e:
                return RunResult("fail", f"does not compile: {e}\n", time.monotonic() - t0)
        if any(not is_ctest(t) for t in tests) and (kind in ("core", "torch") or self.extension_dirty):
            r = self.build_extension(timeout)
            log += r.output
            if r.status != "pass":
                return RunResult(r.status, log, time.monotonic() - t0)
            if kind != "python":
                self.extension_dirty = True  # holds the mutation until rebuilt
        ctests = [t for t in tests if is_ctest(t)]
        if ctests:
            r = self.build_ctests(ctests, timeout - (time.monotonic() - t0))
            log += r.output
            if r.status != "pass":
                return RunResult(r.status, log, time.monotonic() - t0)
        return RunResult("pass", log, time.monotonic() - t0)


# ---- the run ---------------------------------------------------------------------


def evaluate(tree: Tree, m: Mutant, default_timeout: float, logs: str) -> Outcome:
    out = Outcome(m)
    budget = m.timeout or default_timeout
    t0 = time.monotonic()
    path = os.path.join(tree.path, m.file)
    with open(path, encoding="utf-8") as f:
        original = f.read()
    log = [f"mutation {m.id}: {m.what}\n{m.file}\n- {m.find}\n+ {m.replace}\n"]
    try:
        where = locate(original, m.find)
        if len(where) != 1:
            out.status, out.by = "error", "snippet not found in the scratch tree"
            return out
        with open(path, "w", encoding="utf-8") as f:
            f.write(original[: where[0]] + m.replace + original[where[0] + len(m.find) :])
        b = tree.prepare(m, budget)
        log.append(f"\n==== build ({b.seconds:.0f} s)\n{b.output}")
        if b.status == "timeout":
            out.status, out.by = "build-broken", "build timed out"
            return out
        if b.status != "pass":
            out.status = "build-broken"
            return out
        out.status = "SURVIVED"
        for test in m.tests:
            left = budget - (time.monotonic() - t0)
            if left <= 0:
                out.status, out.by = "timeout", f"budget spent before {test}"
                break
            r = tree.run_test(test, left)
            log.append(f"\n==== {test}: {r.status} ({r.seconds:.0f} s)\n{r.output}")
            if r.status == "fail":
                out.status, out.by = "killed", test
                break
            if r.status == "timeout":
                out.status, out.by = "timeout", test
                break
            if r.status == "error":
                out.status, out.by = "error", f"{test} could not run"
                break
        return out
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
        out.seconds = time.monotonic() - t0
        log.append(f"\n==== result: {out.status} {out.by} ({out.seconds:.0f} s)\n")
        with open(os.path.join(logs, m.id + ".log"), "w") as f:
            f.write("".join(log))


def tracked_files() -> List[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [f for f in out.split("\0") if f]


def print_table(outcomes: Sequence[Outcome]) -> None:
    w_id = max([len("mutation")] + [len(o.mutant.id) for o in outcomes])
    w_st = max([len("result")] + [len(o.status) for o in outcomes])
    print(f"{'mutation':<{w_id}}  {'result':<{w_st}}  {'time':>5}  killed by / note")
    print(f"{'-' * w_id}  {'-' * w_st}  {'-' * 5}  {'-' * 40}")
    for o in outcomes:
        print(f"{o.mutant.id:<{w_id}}  {o.status:<{w_st}}  {o.seconds:4.0f}s  {o.by}")
    counts = {
        s: sum(o.status == s for o in outcomes) for s in ("killed", "timeout", "SURVIVED", "build-broken", "error")
    }
    print(
        f"\n{len(outcomes)} mutations: {counts['killed']} killed, {counts['timeout']} timeout, "
        f"{counts['SURVIVED']} SURVIVED, {counts['build-broken']} build-broken, {counts['error']} error"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("ids", nargs="*", help="mutation ids to run (shell patterns allowed); default: all")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--check", action="store_true", help="only check that every snippet still matches")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="mutations at once, one scratch tree each (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutation, build included (default 300)")
    ap.add_argument("--mutants", default=DEFAULT_LIST, help="the list (default tools/mutants.toml)")
    ap.add_argument(
        "--scratch",
        default=os.environ.get("MUTANTS_SCRATCH", DEFAULT_SCRATCH),
        help="scratch folder (default build/mutants)",
    )
    ap.add_argument(
        "--venv",
        default=os.environ.get("VENV", os.path.join(ROOT, ".venv")),
        help="virtualenv whose python builds and tests (default $VENV or .venv)",
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated tree")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # revert on kill as on Ctrl-C

    mutants = load_mutants(args.mutants)
    problems = problems_of(mutants, ROOT)
    if problems:
        print("mutants: the list does not match the sources; fix tools/mutants.toml:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 2
    chosen = select(mutants, args.ids)
    if args.list:
        for m in chosen:
            print(
                f"{m.id}\n    {m.file}: {m.what}\n    - {m.find.strip()}\n    + {m.replace.strip()}\n"
                f"    tests: {', '.join(m.tests)}"
            )
        print(f"{len(chosen)} mutations")
        return 0
    if args.check:
        print(f"mutants: all {len(mutants)} snippets match")
        return 0

    venv = os.path.abspath(args.venv)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"mutants: no python in {venv} (set VENV or --venv)", file=sys.stderr)
        return 2
    os.environ["PATH"] = os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "")
    jobs = os.environ.get("MAX_JOBS", "2")
    scratch = os.path.abspath(args.scratch)
    logs = os.path.join(scratch, "logs")
    os.makedirs(logs, exist_ok=True)
    files = tracked_files()
    workers = max(1, min(args.jobs, len(chosen)))
    trees = [Tree(os.path.join(scratch, f"tree{i}"), python, jobs) for i in range(workers)]

    t_start = time.monotonic()
    for tree in trees:
        print(f"mutants: syncing and building {tree.path}", flush=True)
        tree.sync(files)
        b = tree.build_extension(1800)
        if b.status != "pass":
            print(b.output[-6000:], file=sys.stderr)
            print("mutants: the unmutated tree does not build", file=sys.stderr)
            return 2
        ctests = sorted({t for m in chosen for t in m.ctests()})
        if ctests:
            b = tree.build_ctests(ctests, 1800)
            if b.status != "pass":
                print(b.output[-6000:], file=sys.stderr)
                return 2

    if not args.no_baseline:
        tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
        print(f"mutants: baseline: {len(tests)} tests on the unmutated tree", flush=True)
        for test in tests:
            r = trees[0].run_test(test, args.timeout)
            print(f"  {r.status:<7} {r.seconds:5.0f}s  {test}", flush=True)
            if r.status != "pass":
                print(r.output[-6000:], file=sys.stderr)
                print(f"mutants: {test} does not pass without a mutation; fix it first", file=sys.stderr)
                return 2

    print(f"mutants: {len(chosen)} mutations, {workers} at a time", flush=True)
    todo: queue.Queue[Mutant] = queue.Queue()
    for m in chosen:
        todo.put(m)
    results: Dict[str, Outcome] = {}
    lock = threading.Lock()

    def worker(tree: Tree) -> None:
        while not _stopping.is_set():
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            o = evaluate(tree, m, args.timeout, logs)
            with lock:
                results[m.id] = o
                print(f"  [{len(results)}/{len(chosen)}] {m.id}: {o.status} {o.by} ({o.seconds:.0f} s)", flush=True)

    threads = [threading.Thread(target=worker, args=(t,)) for t in trees]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        print("mutants: interrupted; reverting the running mutations", file=sys.stderr)
        stop_everything()
        for t in threads:
            t.join()
        print_table([results[m.id] for m in chosen if m.id in results])
        return 130
    outcomes = [results[m.id] for m in chosen if m.id in results]
    print()
    print_table(outcomes)
    print(f"total {(time.monotonic() - t_start) / 60:.1f} min; logs in {logs}")
    bad = [o for o in outcomes if o.status not in ("killed", "timeout")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
