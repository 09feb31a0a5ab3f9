"""Train on a paper-equivalent emulated link (Lion Cub, Section 7 and Table A.1): the emulated cluster at the rate
where Lion 32-bit spends the paper's share of a step communicating.

    python -m src.launch.paper_link network=paper_ethernet nodes=2 nproc_per_node=2 -- +exp=demo variant=cub4
    python -m src.launch.paper_link network=paper_infiniband nodes=2 nproc_per_node=1 --force -- +exp=demo

It reads this machine's calibration for the job's setting (`src.launch.calibrate`: cached in results/calibration/,
measured first when absent or with --force), then runs `python -m src.launch.emulate nodes=.. nproc_per_node=..
rate=<calibrated rate> -- network=<link> network.calibration=<file> network.calibrated_share=<share>
network.beta=<1/rate> <job>`, so the run's config.yaml records the link's rate (network.rate, from the emulator),
the target share (network.share), the share the calibration measured and the file it came from. Other key=value
options before `--` (mtu, burst, latency, master_port) and --timeout go to the emulator unchanged.

Root is needed (network namespaces); without it, or without `ip`/`tc`, one line says so and nothing starts.
"""
from __future__ import annotations

import subprocess
import sys

from src.launch.calibrate import REPO_ROOT, CalibrationError, cached_or_calibrate, paper_share
from src.launch.netns import EmulatorUnavailable, NetnsError, check_prerequisites


class UsageError(ValueError):
    """A mistake on the command line."""


def parse(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(our options, the emulator's own options, the job's arguments)."""
    head, job = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    opts = {"network": "paper_ethernet", "nodes": 2, "nproc_per_node": 2, "force": False}
    passed: list[str] = []
    items = iter(head)
    for item in items:
        if item in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        key = item.split("=", 1)[0]
        if item == "--force":
            opts["force"] = True
        elif item == "--timeout":
            passed += [item, next(items, "")]
        elif key in ("nodes", "nproc_per_node") and "=" in item:
            try:
                opts[key] = int(item.split("=", 1)[1])
            except ValueError:
                raise UsageError(f"{item}: not a number") from None
        elif key == "network" and "=" in item:
            opts["network"] = item.split("=", 1)[1]
        elif key == "rate":
            raise UsageError("rate= is what the calibration chooses; give network=paper_ethernet or "
                             "network=paper_infiniband, or use python -m src.launch.emulate for a rate of your own")
        elif key in ("mtu", "burst", "latency", "master_port") and "=" in item:
            passed.append(item)
        else:
            raise UsageError(f"unexpected argument {item!r}; options are network=, nodes=, nproc_per_node=, mtu=, "
                             "burst=, latency=, master_port=, --force, --timeout S, and the job's arguments after --")
    if any(a.split("=", 1)[0].lstrip("+") in ("network", "network.rate", "network.calibration") for a in job):
        raise UsageError(f"give the link as network={opts['network']} before --, not among the job's overrides")
    return opts, passed, job


def emulate_command(opts: dict, passed: list[str], job: list[str], path, record: dict) -> list[str]:
    rate = int(record["rate"])
    return [sys.executable, "-m", "src.launch.emulate", f"nodes={opts['nodes']}",
            f"nproc_per_node={opts['nproc_per_node']}", f"rate={rate}bit", *passed, "--",
            f"network={opts['network']}", f"network.calibration={path}",
            f"network.calibrated_share={record['verified_share']}", f"network.beta={1.0 / rate:.6g}", *job]


def main(argv: list[str] | None = None) -> int:
    try:
        opts, passed, job = parse(sys.argv[1:] if argv is None else argv)
        paper_share(opts["network"])
        try:
            check_prerequisites()
        except EmulatorUnavailable as exc:
            raise EmulatorUnavailable(f"network={opts['network']} is an emulated link: {exc}") from None
        path, record = cached_or_calibrate(opts["network"], job, opts["nodes"], opts["nproc_per_node"],
                                           force=opts["force"])
    except (UsageError, CalibrationError, EmulatorUnavailable, NetnsError) as exc:
        print(f"lcub: error: {exc}", file=sys.stderr)
        return 2
    child = subprocess.Popen(emulate_command(opts, passed, job, path, record), cwd=REPO_ROOT)
    while True:
        try:  # Ctrl-C reaches the emulator too; it tears the cluster down and exits, and we wait for it
            return child.wait()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    sys.exit(main())
