"""The command line that launched this run, and the one that resumes it (printed when a run is interrupted).

Under torchrun a worker does not see the user's command, only its own arguments; its parent is the torchrun agent,
whose command line (`/proc/<parent>/cmdline` on Linux) ends with exactly those arguments. The launcher part (e.g.
`torchrun --standalone --nproc_per_node 2 -m src.train`) is that command line without them. Elsewhere (no
/proc, or a parent that is not the launcher) it is rebuilt from torchrun's variables. Without torchrun it is this
process's own interpreter and module or script. The interpreter or console script is shortened to its name when
that name on PATH is the same file, so the command reads as typed.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

DROPPED_ON_RESUME = ("resume", "resume_rewind", "run.dir", "hydra.mode")
_PLAIN = re.compile(r"[A-Za-z0-9_./+-]*")


def override(key: str, value) -> str:
    """`key=value` as a Hydra override, quoted when the value holds characters the override grammar would parse."""
    text = str(value)
    return f"{key}={text}" if _PLAIN.fullmatch(text) else f'{key}="{text.replace(chr(34), chr(92) + chr(34))}"'


def _short(argv: list[str]) -> list[str]:
    """`python -m ...` / `torchrun ...` instead of absolute paths when PATH finds the same files."""
    def same(name: str, path: str) -> bool:
        found = shutil.which(name)
        return bool(found) and os.path.realpath(found) == os.path.realpath(path)

    argv = list(argv)
    if len(argv) > 1 and os.path.isabs(argv[1]) and same(Path(argv[1]).name, argv[1]):
        return [Path(argv[1]).name, *argv[2:]]  # a console script run by its interpreter (torchrun)
    for name in ("python", "python3", Path(argv[0]).name):
        if argv and same(name, argv[0]):
            return [name, *argv[1:]]
    return argv


def _parent_cmdline() -> list[str] | None:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def launcher() -> list[str]:
    """The command up to the training module: `python -m src.train`, `torchrun ... -m src.train`, ..."""
    args = sys.argv[1:]
    if "TORCHELASTIC_RUN_ID" in os.environ or "TORCHELASTIC_RESTART_COUNT" in os.environ:
        parent = _parent_cmdline()
        if parent and len(parent) > len(args) and parent[len(parent) - len(args):] == args:
            return _short(parent[:len(parent) - len(args)])
        nodes = -(-int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        return ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', '1')}",
                "-m", "src.train"]
    own = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    return _short(own[:len(own) - len(args)] if args else own)


def this_command() -> list[str]:
    return [*launcher(), *sys.argv[1:]]


def sweep_resume_command(sweep_dir: Path) -> str:
    """The shell command that runs this sweep again in its folder: finished runs are skipped, the others resume."""
    dropped = (*DROPPED_ON_RESUME, "run.sweep")
    kept = [a for a in sys.argv[1:] if a.lstrip("+~").split("=", 1)[0] not in dropped]
    return shlex.join([*launcher(), *kept, override("run.sweep", Path(sweep_dir).resolve()), "resume=auto"])


def resume_command(overrides: list[str], run_dir: Path) -> str:
    """The shell command that continues this run from its newest checkpoint (one run, not a sweep)."""
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in DROPPED_ON_RESUME]
    return shlex.join([*launcher(), *kept, override("resume", Path(run_dir).resolve())])
