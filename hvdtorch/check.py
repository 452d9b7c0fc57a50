"""What this build of hvdtorch and this machine can do.

    python -m hvdtorch.check                     # one process: build, machine, knobs
    python -m hvdtorch.check --json              # the same as one JSON object
    python -m hvdtorch.check --option reducer=ring --option timeout=30
    torchrun --nproc_per_node=2 -m hvdtorch.check   # also a quick all-reduce across the job
    mpirun -np 2 python -m hvdtorch.check

It reports the torch and hvdtorch versions; what the extension was compiled
with (C++ standard, whether the CUDA device is built and for which GPUs, how
many GPUs the CUDA runtime sees, and why none); whether NCCL (through
torch.distributed), MPI and Gloo are there; whether a shared-memory segment can be created and removed; the
reducers this build has, their cost model (summarised), the one ``auto`` picks
per message size and the settings the engine's parts run with; and every HVDTORCH_* knob with its value and where that
value came from (default, environment, or an ``--option`` argument, which
wins over the environment exactly as ``hvd.init(**options)`` does).

Under a launcher every rank joins the job, all-reduces a small tensor with
each available reducer (checking the sums), and rank 0 prints each rank's
host, local rank and the kinds of link it used to reach its peers.

Exit status: 0 when everything works; 1 when the build is broken (the
compiled extension hvdtorch._C does not load, a knob is invalid, shared
memory is unusable while HVDTORCH_SHM is on, or an all-reduce gives a wrong
sum or fails).
"""

import argparse
import json
import os
import platform
import shutil
import sys
from typing import Dict, List

# Sizes at which the report says which reducer `auto` runs.
PROBE_BYTES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)


def _human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def versions() -> Dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import hvdtorch

        out["hvdtorch"] = hvdtorch.__version__
    except Exception:  # reported as a broken build by extension()
        out["hvdtorch"] = "(cannot be imported)"
    for name in ("lightning", "ray"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception:
            out[name] = "not installed"
    return out


def extension() -> Dict[str, object]:
    """Whether the compiled core loads; the error when it does not."""
    try:
        from hvdtorch import _C

        return {"ok": True, "path": _C.__file__}
    except Exception as e:  # ImportError, or an undefined symbol after a torch upgrade
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def backends() -> Dict[str, object]:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    nccl = dist.is_nccl_available()  # torch.distributed has its NCCL process group (a CUDA build of torch)
    nccl_version = None
    if nccl:
        try:
            nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            pass
    try:
        import mpi4py

        mpi4py_version = mpi4py.__version__
    except ImportError:
        mpi4py_version = None
    return {
        "cuda": cuda,
        "cuda_version": torch.version.cuda,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "nccl": nccl,
        "nccl_version": nccl_version,
        "gloo": dist.is_gloo_available(),
        "mpirun": shutil.which("mpirun") or shutil.which("mpiexec"),
        "mpi4py": mpi4py_version,
        "torch_mpi_backend": dist.is_mpi_available(),
    }


def build() -> Dict[str, object]:
    """What the extension was compiled with (hvdtorch._C.build_info())."""
    from hvdtorch import _C

    return dict(_C.build_info())


def cuda_lines(build_info: Dict[str, object], b: Dict[str, object]) -> List[str]:
    """CUDA and NCCL in words: what the build holds, what torch offers, what
    this machine shows, and why where something is missing."""
    if build_info.get("cuda_device"):
        visible = build_info["cuda_devices_visible"]
        why = f": {build_info['cuda_devices_why_none']}" if not visible else ""
        cuda = (
            f"built (device code for sm_{build_info['cuda_architectures']}, nvcc {build_info['cuda_compiler']}); "
            f"{visible} GPUs visible to the CUDA runtime{why}; CUDA tensors: the device ring on one host, "
            "staged through pinned host memory otherwise"
        )
    elif build_info.get("torch_cuda"):
        cuda = "not built: torch is a CUDA build, but no CUDA compiler (nvcc) was found when hvdtorch was built"
    elif b["cuda_version"] is None:
        cuda = "not built: the installed torch is a CPU build"
    else:
        cuda = "not built: hvdtorch was built against a CPU build of torch"
    if b["nccl"]:
        version = f" (NCCL {b['nccl_version']})" if b["nccl_version"] else ""
        use = "usable" if b["gpus"] else "not usable here: no GPU is visible to torch"
        nccl = f"torch.distributed has NCCL{version}; {use}"
    else:
        nccl = "no: torch.distributed has no NCCL process group (a CPU build of torch)"
    return [f"  CUDA       {cuda}", f"  NCCL       {nccl}"]


def shared_memory() -> Dict[str, object]:
    """Creates, writes, reads back and removes one POSIX shared-memory segment
    (the kind the same-host links use)."""
    from multiprocessing import shared_memory as shm

    out: Dict[str, object] = {"ok": False}
    try:
        st = os.statvfs("/dev/shm")
        out["dev_shm_free_bytes"] = st.f_bavail * st.f_frsize
    except OSError:
        out["dev_shm_free_bytes"] = None
    try:
        seg = shm.SharedMemory(create=True, size=1 << 16)
    except Exception as e:
        out["error"] = f"cannot create a segment: {e}"
        return out
    try:
        seg.buf[:4] = b"hvdt"
        out["ok"] = bytes(seg.buf[:4]) == b"hvdt"
        if not out["ok"]:
            out["error"] = "a segment does not read back what was written"
    finally:
        seg.close()
        try:
            seg.unlink()
        except Exception as e:
            out["ok"] = False
            out["error"] = f"cannot remove a segment: {e}"
    return out


def knob_table(options: Dict[str, str], env=os.environ) -> List[Dict[str, str]]:
    """Every HVDTORCH_* knob: its value and where it came from. An option
    (hvd.init keyword, here --option) wins over the environment, which wins
    over the default -- the order the engine's Config applies them in."""
    import hvdtorch

    lowered = {k.lower(): v for k, v in options.items()}
    rows = []
    for name, default, meaning in hvdtorch.knobs():
        key = name[len("HVDTORCH_") :].lower()
        if key in lowered:
            value, source = lowered[key], "argument"
        elif name in env:
            value, source = env[name], "environment"
        else:
            value, source = default, "default"
        rows.append({"name": name, "value": value, "source": source, "default": default, "meaning": meaning})
    return rows


def unknown_environment(env=os.environ) -> List[str]:
    """HVDTORCH_* variables that are set but are no knob (typos), by the
    rule init() warns by (hvdtorch/knob_names.py)."""
    from hvdtorch import knob_names

    return [name for name, _ in knob_names.unknown_variables(env)]


def reducers() -> Dict[str, object]:
    """The reducers of the running engine, their cost model, the choice of
    `auto` per size (float32 Sum), and what the engine's parts run with
    (segment sizes, windows, shards, the response cache: read from each part,
    so a knob that did not arrive shows here)."""
    import torch

    import hvdtorch as hvd

    engine = hvd.runtime.state().engine
    model = engine.cost_model()
    picks = {str(n): engine.choose_reducer(n, torch.float32) for n in PROBE_BYTES}
    return {
        "available": sorted(model),
        "cost_model": {k: {"alpha_s": a, "beta_s_per_byte": b} for k, (a, b) in model.items()},
        "auto_picks": picks,
        "settings_in_use": engine.settings_in_use(),
        "output_pool": hvd._C.output_pool_stats(),
    }


def job_probe(reducer_names: List[str], timeout_s: float = 30.0) -> Dict[str, object]:
    """Every rank all-reduces rank+1 with each reducer (the sum must be
    size(size+1)/2; Adasum gets equal inputs and must return them), then the
    ranks' host, local rank and link kinds are gathered to every rank."""
    import torch

    import hvdtorch as hvd
    from hvdtorch import _C

    # Reducers that define their own reduce op (a Sum asked of them becomes that op), checked on inputs
    # where that op's result is known.
    own_op_reducers = {row["name"] for row in _C.reducer_registry() if row["own_op"] is not None}
    size = hvd.size()
    results = {}
    for name in reducer_names:
        if name in own_op_reducers:
            # Adasum of equal vectors is that vector, on any number of ranks.
            t, expected = torch.full((1024,), 2.0), 2.0
        else:
            t, expected = torch.full((1024,), float(hvd.rank() + 1)), size * (size + 1) / 2
        try:
            out = hvd.allreduce(t, op=hvd.Sum, name=f"check.{name}", reducer=name)
            ok = bool(torch.all(out == expected))
            results[name] = "ok" if ok else f"wrong sum {out[0].item()} (expected {expected})"
        except Exception as e:
            results[name] = f"failed: {e}"
    engine = hvd.runtime.state().engine
    mine = {
        "rank": hvd.rank(),
        "host": hvd.launch.hostname(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "links": {str(peer): kinds for peer, kinds in engine.link_kinds().items()},
        "allreduce": results,
    }
    return {"size": size, "ranks": hvd.allgather_object(mine)}


def collect(options: Dict[str, str]) -> Dict[str, object]:
    """The whole report of this rank; ``report["ok"]`` is False when something is broken."""
    report: Dict[str, object] = {
        "versions": versions(),
        "extension": extension(),
        "backends": backends(),
        "shared_memory": shared_memory(),
    }
    problems: List[str] = []
    if not report["extension"]["ok"]:
        problems.append(
            f"the compiled extension hvdtorch._C does not load ({report['extension']['error']}); "
            "rebuild: pip install --no-build-isolation . (or make build)"
        )
        report["problems"], report["ok"] = problems, False
        return report
    from hvdtorch import _C, launch

    report["build"] = build()
    report["knobs"] = knob_table(options)
    report["unknown_environment"] = unknown_environment()
    try:
        _C.resolve_options(options)
    except ValueError as e:
        problems.append(str(e))
        report["problems"], report["ok"] = problems, False
        return report
    shm_on = next(r["value"] for r in report["knobs"] if r["name"] == "HVDTORCH_SHM") not in ("0", "false")
    if not report["shared_memory"]["ok"] and shm_on:
        problems.append(
            f"shared memory is unusable ({report['shared_memory'].get('error')}); "
            "set HVDTORCH_SHM=0 to use the c10d link between local ranks"
        )
    info = launch.detect()
    report["launcher"] = info.launcher
    import hvdtorch as hvd

    try:
        hvd.init(**options)
        report["reducers"] = reducers()
        if hvd.size() > 1:
            report["job"] = job_probe(report["reducers"]["available"])
            for r in report["job"]["ranks"]:
                problems += [
                    f"rank {r['rank']}: all-reduce with {k}: {v}" for k, v in r["allreduce"].items() if v != "ok"
                ]
    except Exception as e:
        problems.append(f"init or the all-reduce failed: {type(e).__name__}: {e}")
    finally:
        report["rank"] = hvd.rank() if hvd.is_initialized() else info.rank
        hvd.shutdown()
    report["problems"], report["ok"] = problems, not problems
    return report


def _yes(flag) -> str:
    return "yes" if flag else "no"


def format_report(r: Dict[str, object]) -> str:
    lines = ["hvdtorch check", "", "versions"]
    lines += [f"  {k:<10} {v}" for k, v in r["versions"].items()]
    ext = r["extension"]
    lines += ["", "build", f"  extension  {'loads (' + ext['path'] + ')' if ext['ok'] else 'BROKEN: ' + ext['error']}"]
    b = r["backends"]
    if "build" in r:
        torch_kind = f"CUDA {b['cuda_version']}" if b["cuda_version"] else "CPU"
        lines += [f"  compiled   C++{r['build']['cxx_standard']} against torch {r['versions']['torch']} ({torch_kind})"]
        lines += cuda_lines(r["build"], b)
    lines += [
        f"  Gloo       {_yes(b['gloo'])}",
        f"  MPI        mpirun: {b['mpirun'] or 'not found'}; mpi4py: {b['mpi4py'] or 'not installed'}; "
        f"torch MPI backend: {_yes(b['torch_mpi_backend'])}",
    ]
    s = r["shared_memory"]
    free = s.get("dev_shm_free_bytes")
    lines += [
        f"  shm        {'usable' if s['ok'] else 'UNUSABLE: ' + s.get('error', '')}"
        + (f" (/dev/shm free: {free / 2**30:.1f} GiB)" if free is not None else "")
    ]
    if "launcher" in r:
        lines += [f"  launcher   {r['launcher']}"]
    if "reducers" in r:
        red = r["reducers"]
        how = "measured at init and refined online" if r.get("job") else "defaults: one process, nothing to measure"
        lines += [
            "",
            f"reducers (per-size-band cost model, summarised as t(n) = alpha + beta*n from 4 KiB to 256 MiB; {how})",
        ]
        for name, m in red["cost_model"].items():
            beta = m["beta_s_per_byte"]
            rate = f"  ({1 / beta / 1e9:.2f} GB/s)" if beta > 0 else ""
            lines.append(f"  {name:<8} alpha {m['alpha_s'] * 1e6:9.1f} us   beta {beta * 1e9:8.3f} ns/B{rate}")
        lines.append(
            "  auto picks: " + ", ".join(f"{_human_bytes(int(n))} -> {k}" for n, k in red["auto_picks"].items())
        )
        lines.append("  in use: " + ", ".join(f"{k} {v}" for k, v in red["settings_in_use"].items()))
        pool = red["output_pool"]
        lines.append(
            f"  output pool: keeps up to {_human_bytes(pool['limit_bytes'])}, holds {_human_bytes(pool['kept_bytes'])} "
            f"in {pool['kept_blocks']} blocks; {pool['reused']} outputs reused, {pool['fresh']} mapped fresh"
        )
    if "job" in r:
        job = r["job"]
        lines += ["", f"job: {job['size']} ranks"]
        lines.append(f"  {'rank':>4}  {'host':<20} {'local':>5}  {'links (peer: kinds)':<40} all-reduce")
        for p in job["ranks"]:
            links = " ".join(f"{peer}:{'+'.join(k)}" for peer, k in sorted(p["links"].items(), key=lambda x: int(x[0])))
            ar = ", ".join(f"{k} {v}" for k, v in p["allreduce"].items())
            lines.append(f"  {p['rank']:>4}  {p['host']:<20} {p['local_rank']:>5}  {links or '-':<40} {ar}")
    if "knobs" in r:
        lines += ["", "knobs"]
        width = max(len(k["name"]) for k in r["knobs"]) + 2
        value_width = max(12, *(len(k["value"] or "(empty)") for k in r["knobs"])) + 2
        for k in r["knobs"]:
            lines.append(f"  {k['name']:<{width}}{k['value'] or '(empty)':<{value_width}}{k['source']}")
        from hvdtorch import knob_names

        for name in r.get("unknown_environment", []):
            near = knob_names.closest(name, [k["name"] for k in r["knobs"]])
            hint = f" (did you mean {near}?)" if near else ""
            lines.append(f"  {name}: set in the environment but not a knob hvdtorch knows{hint}")
    lines += [""]
    lines += ["OK" if r["ok"] else "PROBLEMS"] + [f"  - {p}" for p in r.get("problems", [])]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdtorch.check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a knob as hvd.init(KEY=VALUE) would set it (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--option wants KEY=VALUE, got {item!r}")
        options[key.strip()] = value
    report = collect(options)
    if report.get("rank", 0) == 0:
        print(json.dumps(report, indent=1) if args.json else format_report(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
