"""The main job (`make demo`): GoogLeNet trained on CPU with 1 and then 2
processes through torchrun, and the scaling efficiency of 2 processes
against twice the 1-process throughput. One thread per process."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_ARGS = ["--image-size", "64", "--batch-size", "16", "--steps", "20", "--warmup", "4", "--json"]


def run(nproc: int) -> dict:
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, f"--nproc_per_node={nproc}", "--master_port", str(29400 + nproc),
           os.path.join(ROOT, "examples", "train.py"), *TRAIN_ARGS]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    print(f"$ {' '.join(['torchrun', f'--nproc_per_node={nproc}', 'examples/train.py', *TRAIN_ARGS])}", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        else:
            print("  " + line)
    if proc.returncode != 0 or result is None:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"demo: training with {nproc} process(es) failed (exit {proc.returncode})")
    return result


def main():
    one = run(1)
    two = run(2)
    eff = two["img_per_s"] / (2 * one["img_per_s"])
    print()
    print("GoogLeNet on CPU, 64x64 synthetic images, batch 16 per process, 1 thread per process")
    print(f"  1 process : {one['img_per_s']:7.1f} img/s")
    print(f"  2 processes: {two['img_per_s']:7.1f} img/s")
    print(f"  scaling efficiency: {eff * 100:.0f}% of ideal (2 x 1-process throughput)")


if __name__ == "__main__":
    main()
