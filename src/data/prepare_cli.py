"""The command line of the text preparations (the data of Lion Cub's GPT experiments, Section 7 and Appendix D).

`report` runs one preparation: its one-line summary and exit status 0, or, for a `DataError`, one `error:` line on
stderr and exit status 1 (no traceback). `corpus_main` is the whole command of a corpus this project ships (the demo
corpus, the laptop corpus): `--out`, `--bpe-file`, `--force`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from .errors import DataError


def report(prepare: Callable[[], dict], summary: Callable[[dict], str]) -> int:
    """Run `prepare()` and print `summary(meta)` of what it returns (0), or its `DataError` in one line (1)."""
    try:
        meta = prepare()
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary(meta))
    return 0


def corpus_main(argv: list[str] | None, prog: str, description: str, out_help: str,
                prepare: Callable[..., dict], summary: Callable[[dict], str]) -> int:
    """`prepare(out, bpe_file=, force=, progress=True)` of a shipped corpus, from the command line `argv`."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--bpe-file", default=None)
    p.add_argument("--force", action="store_true", help="re-prepare even when the folder is up to date")
    args = p.parse_args(argv)
    return report(lambda: prepare(args.out, bpe_file=args.bpe_file, force=args.force, progress=True),
                  lambda meta: f"{args.out}: {summary(meta)}")
