"""The wheels of lioncub's non-torch dependencies that a GPU machine without network needs (`make gpu-wheels`).

    python -m src.bench.gpu_check.wheels --out .whl [--python-version 3.12] [--platform manylinux_2_28_x86_64 ...]
    python -m src.bench.gpu_check.wheels --list      # the pinned requirements it would fetch

The GPU machine (docs/gpu.md) has its own torch and many packages already; what it lacks travels as a folder of
wheels, installed there with `pip install --no-index --no-deps`. Every requirement of requirements.txt is in
exactly one of:

- `TORCH`: the GPU image's own torch and torchvision are used (src.compat.MIN_TORCH says how old torch may be);
- `IN_GPU_IMAGE`: present in the GPU image (its package list: /work/.library/device/KINDS.md of this workplace);
- `CARRIED`: fetched into the folder, with the dependencies the image lacks, pinned to the versions installed on
  this machine (the versions the test suite ran with; a bare name where one is not installed here); also
  openai-whisper, which `make install` adds beside requirements.txt for its GPT-2 BPE file;
- `NOT_CARRIED`: not needed to run `make gpu-check` or training there, each with its reason (the device tool takes
  at most 64 MiB of files per call, and these are large or pull in a dozen more packages).

Wheels come from PyPI for the target Python and platform (`pip download --only-binary=:all: --no-deps`); a package
that PyPI has as source only (`SOURCE_ONLY`, pure Python) is built into a wheel here (`pip wheel --no-deps`).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements.txt"
TORCH = ("torch", "torchvision")
IN_GPU_IMAGE = ("numpy", "timm", "tiktoken", "pyarrow", "tqdm", "matplotlib", "pandas", "psutil", "pytest")
CARRIED = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "hydra-submitit-launcher", "submitit", "datasets",
           "dill", "multiprocess", "openai-whisper")  # whisper: see BESIDE_REQUIREMENTS
NOT_CARRIED = {
    "wandb": "W&B logging: the GPU check and short runs log with logger=local (wandb's wheel is ~20 MB and needs "
             "gitpython, sentry-sdk, pydantic and more)",
    "nbclient": "runs the notebooks' tests only",
    "nbformat": "reads the notebooks' tests only",
    "ipykernel": "the notebooks' kernel only (a dozen Jupyter packages)",
}
# On PyPI as source archives only: antlr4 4.9.x (hydra-core 1.3 needs it) and openai-whisper; both pure Python.
SOURCE_ONLY = ("antlr4-python3-runtime", "openai-whisper")
# Installed by `make install` beside requirements.txt: openai-whisper (no dependencies) ships GPT-2's BPE ranks file,
# which the demo corpus's tokenizer reads without importing whisper (src/data/tokenizer.py).
BESIDE_REQUIREMENTS = ("openai-whisper",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path = REQUIREMENTS) -> list[str]:
    """The normalized project names of a requirements file (comments, options and version specifiers dropped)."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        names.append(normalize(re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]))
    return names


def uncovered(names: list[str]) -> list[str]:
    """The names in none of TORCH, IN_GPU_IMAGE, CARRIED, NOT_CARRIED."""
    known = {normalize(n) for n in (*TORCH, *IN_GPU_IMAGE, *CARRIED, *NOT_CARRIED)}
    return [n for n in names if n not in known]


def pinned(name: str) -> str:
    """`name==<version installed here>`, or `name` alone when it is not installed here."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def commands(out: Path, python_version: str, platforms: tuple[str, ...] = PLATFORMS) -> list[list[str]]:
    """The pip commands that fill `out` with the CARRIED wheels for that Python and platform."""
    binary = [pinned(n) for n in CARRIED if n not in SOURCE_ONLY]
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                python_version, "--implementation", "cp", *[f"--platform={p}" for p in platforms], "-d", str(out),
                *binary]
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), *[pinned(n) for n in SOURCE_ONLY]]
    return [download, build]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".whl", help="folder for the wheels (default .whl, ignored by git)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--platform", action="append", help=f"wheel platform tags (default: {' '.join(PLATFORMS)})")
    parser.add_argument("--list", action="store_true", help="print the pinned requirements and exit")
    args = parser.parse_args(argv)
    missing = uncovered(requirement_names())
    if missing:
        print(f"gpu-wheels: requirements.txt names {', '.join(missing)}, which src/bench/gpu_check/wheels.py does not "
              "place (TORCH, IN_GPU_IMAGE, CARRIED or NOT_CARRIED)", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(pinned(n) for n in CARRIED))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for cmd in commands(out, args.python_version, tuple(args.platform or PLATFORMS)):
        if subprocess.run(cmd, check=False).returncode != 0:
            print(f"gpu-wheels: failed: {' '.join(cmd)}", file=sys.stderr)
            return 1
    print(f"gpu-wheels: {len(list(out.glob('*.whl')))} wheels in {out} (Python {args.python_version}); "
          "install there with: python3 -m pip install --no-index --no-deps --target /tmp/site " + f"{out}/*.whl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
