"""Calibrate a paper-equivalent emulated link (Lion Cub, Section 7 and Table A.1): the link rate at which Lion 32-bit
spends the paper's share of a step communicating.

    python -m src.launch.calibrate network=paper_ethernet nodes=2 nproc_per_node=1 [--force] -- +exp=demo

The paper's Lion (32bit) spends 756.3 of 930.6 ms per step communicating (81 %) with GPT 774M on 2 nodes x 4 H100s
over Ethernet, and 159.5 of 435.0 ms (37 %) with GPT 1558M on 2 nodes over InfiniBand (Table A.1). On this machine
the compute of a step is far slower and the model far smaller, so no fixed rate reproduces those proportions; this
module finds, for one training setting (the job's overrides without its variant and run length), the rate that
does. It trains Lion 32-bit for a few steps on the emulated cluster (`src.launch.emulate`) at a first rate, then at
a second rate guessed from the first (communication taken proportional to 1/rate). Any run whose share lies within
`TOLERANCE` of the target ends the search. Otherwise it fits `communicate = a + k / rate` through every run so far
(least squares: the link's part of a step depends on the rate alone and is steady from run to run), solves for the
rate whose communication is `share / (1 - share)` times the step's other time, and verifies with one more run at
that rate, at most `MAX_REFITS` + 1 times. The step's other time (compute) is what moves when the machine's load
drifts, so it is taken from the latest runs (the median of the last three), not from the first. A second link of
the same machine and setting starts from the first link's runs instead of measuring two new ones.

The result is cached in `results/calibration/<network>-<key>.json` (written whole or not at all); the key digests
the machine (CPU model, ISA, cores), the cluster shape and the setting, so a run on the same machine and setting
reuses it and another machine calibrates anew. The file records the target share (the network config's `share`,
quoted from Table A.1), the machine, every calibration run's times, the fit, the rate, and the verified share.

Errors (one line, `CalibrationError`): a share outside (0, 1); a setting whose communication cannot be made to
reach the share (its rate-independent part `a` already exceeds the target, or the rate would have to exceed what
the emulated link can carry, `MAX_RATE`); a verification that still misses after the refits. Deliberate difference
from the paper: the share is matched for Lion 32-bit only, and on the machine as busy as it is during the
calibration (the record keeps the load average; a calibration made while other jobs shared the cores gives a
slower link than a quiet machine needs: rerun with --force); the other variants' shares follow from their bytes and
this machine's quantization cost.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "results" / "calibration"

CONF_DIR = REPO_ROOT / "conf" / "network"
TOLERANCE = 0.03          # a verified share this close to the target is accepted (the test allows 0.05)
MAX_REFITS = 3
FIRST_RATE = 10**9        # bits/s of the first calibration run
MIN_RATE = 8_000          # tc's floor for a usable link (src.launch.netns.parse_rate)
# The fastest link the emulator shapes faithfully here: the unlimited veth path measured 5.36 Gbit/s
# (docs/emulated_cluster.md, "Fitted alpha-beta model"); a rate above it is not a limit on this machine.
MAX_RATE = 5 * 10**9
STEPS, TIMING_SKIP = 14, 2  # per calibration run: 12 timed steps
RECENT = 3                # the compute estimate: the median of the latest runs' compute
# Overrides of a job that do not change a Lion 32-bit step's compute or bytes; the calibration drops them. The batch
# size changes the compute but not the bytes: it is left out so that one link serves every batch size of a model
# (Fig. 11 varies the batch on the paper's one network); the calibration runs at the config's own batch size.
IGNORED = ("variant", "train.", "run.", "checkpoint.", "logger", "network", "stats.", "seed", "resume", "fault.",
           "guard.", "nonfinite.", "data.dir", "data.batch_size")


class CalibrationError(RuntimeError):
    """The requested share cannot be calibrated on this machine; the message says what to do."""


def paper_share(network: str) -> float:
    """The share of Lion (32bit)'s step spent communicating that `network` reproduces: its config's `share` (the
    paper's Table A.1 row, quoted there)."""
    import yaml

    path = CONF_DIR / f"{network}.yaml"
    share = yaml.safe_load(path.read_text()).get("share") if path.is_file() else None
    if not isinstance(share, float):
        known = sorted(p.stem for p in CONF_DIR.glob("*.yaml") if "share:" in p.read_text())
        raise CalibrationError(f"network={network} states no share of the paper's step to calibrate against; "
                               f"choose one of {', '.join(known)}")
    return share


def machine() -> dict:
    """What the calibration depends on besides the setting: CPU model, ISA torch uses, cores of this process, the
    threads its ranks inherit (OMP_NUM_THREADS) and torch's version."""
    import torch

    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": model, "isa": torch.backends.cpu.get_cpu_capability(), "cores": cores,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__}


def setting(job_args: list[str]) -> list[str]:
    """The overrides of `job_args` that shape a Lion 32-bit step (model, data, batch, optimizer settings)."""
    def key(arg: str) -> str:
        return arg.split("=", 1)[0].lstrip("+~")
    return [a for a in job_args if "=" in a and not key(a).startswith(IGNORED)]


def cache_path(network: str, nodes: int, nproc_per_node: int, overrides: list[str], where: Path = CACHE_DIR) -> Path:
    """`<where>/<network>-<key>`: the key digests machine, cluster shape and setting (the links of one setting share
    it, so one link's calibration runs seed another's)."""
    blob = json.dumps({"machine": machine(), "nodes": nodes, "nproc_per_node": nproc_per_node,
                       "setting": overrides}, sort_keys=True)
    return Path(where) / f"{network}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}.json"


def sibling_points(path: Path) -> list["Point"]:
    """The runs of the other links' calibrations of the same machine, cluster and setting."""
    key = path.stem.rsplit("-", 1)[-1]
    points = []
    for other in sorted(path.parent.glob(f"*-{key}.json")):
        if other != path:
            try:
                points += [Point(r["rate"], r["communicate_ms"] / 1000, r["total_ms"] / 1000)
                           for r in json.loads(other.read_text())["runs"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return points


# --- the fit -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One calibration run: mean seconds per timed step of communication and of the whole step, at `rate` bits/s."""
    rate: int
    communicate: float
    total: float

    @property
    def compute(self) -> float:
        return self.total - self.communicate

    @property
    def share(self) -> float:
        return self.communicate / self.total

    def record(self) -> dict:
        return {"rate": self.rate, "communicate_ms": round(1000 * self.communicate, 2),
                "total_ms": round(1000 * self.total, 2), "share": round(self.share, 4)}


def fit(p: Point, q: Point) -> tuple[float, float]:
    """(a, k) of `communicate = a + k / rate` through two points (k > 0 bits; a seconds, may be negative)."""
    if p.rate == q.rate:
        raise CalibrationError(f"two calibration runs at the same rate {p.rate} bit/s cannot be fitted")
    k = (p.communicate - q.communicate) / (1 / p.rate - 1 / q.rate)
    if k <= 0:
        raise CalibrationError(f"communication did not grow as the link slowed ({p.record()} vs {q.record()}); the "
                               "machine is too busy to calibrate: rerun when it is quieter")
    return p.communicate - k / p.rate, k


def fit_all(points: list[Point]) -> tuple[float, float]:
    """(a, k) of `communicate = a + k / rate`, least squares through every point (two points: the line through them;
    one point: the line through it and the origin)."""
    if len(points) == 1:
        return 0.0, points[0].communicate * points[0].rate
    if len({p.rate for p in points}) < 2:
        raise CalibrationError(f"calibration runs at one rate only ({points[0].rate} bit/s) cannot be fitted")
    if len(points) == 2:
        return fit(*points)
    xs, ys = [1 / p.rate for p in points], [p.communicate for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if k <= 0:
        raise CalibrationError(f"communication did not grow as the link slowed ({[p.record() for p in points]}); the "
                               "machine is too busy to calibrate: rerun when it is quieter")
    return my - k * mx, k


def recent_compute(points: list[Point]) -> float:
    """The step's other time now: the median compute of the latest `RECENT` runs."""
    latest = sorted(p.compute for p in points[-RECENT:])
    mid = len(latest) // 2
    return latest[mid] if len(latest) % 2 else (latest[mid - 1] + latest[mid]) / 2


def solve(share: float, a: float, k: float, compute: float) -> int:
    """The rate (bits/s) at which `a + k / rate` is `share` of the step, the step's other time being `compute`."""
    if not 0 < share < 1:
        raise CalibrationError(f"share={share} must lie strictly between 0 and 1")
    target = share / (1 - share) * compute
    if target <= a:
        raise CalibrationError(f"Lion 32-bit's communication here has a part of {1000 * a:.1f} ms/step that no link "
                               f"rate removes, above the {1000 * target:.1f} ms the {100 * share:.0f} % share allows; "
                               "use a larger model or batch (more compute per step) or a higher share")
    rate = k / (target - a)
    if rate > MAX_RATE:
        raise CalibrationError(f"the {100 * share:.0f} % share needs a {rate / 1e9:.2f} Gbit/s link, faster than the "
                               f"emulated link can carry on this machine ({MAX_RATE / 1e9:g} Gbit/s); use a model "
                               "with more bytes per step of compute (wider, or a smaller batch) or a higher share")
    if rate < MIN_RATE:
        raise CalibrationError(f"the {100 * share:.0f} % share needs a {rate:.0f} bit/s link, below tc's "
                               f"{MIN_RATE} bit/s; use a smaller model or a lower share")
    return int(round(rate, -3))  # whole kbit/s: tc's units


def guess_rate(first: Point, share: float) -> int:
    """A second rate from the first point, taking communication as proportional to 1/rate (a = 0)."""
    target = share / (1 - share) * first.compute
    return int(min(MAX_RATE, max(MIN_RATE, round(first.communicate * first.rate / target, -3))))


# --- the runs ------------------------------------------------------------------------------------------------------
def timed_point(run_dir: Path, rate: int) -> Point:
    """The mean `time/communicate` and `time/total` of the timed steps of a finished run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/total" in r][TIMING_SKIP:]
    if not rows:
        raise CalibrationError(f"{run_dir}: the calibration run logged no timed step")
    return Point(rate, sum(r.get("time/communicate", 0.0) for r in rows) / len(rows),
                 sum(r["time/total"] for r in rows) / len(rows))


def run_lion32(rate: int, overrides: list[str], nodes: int, nproc_per_node: int, scratch: Path, say) -> Point:
    """Train Lion 32-bit for STEPS steps on the emulated cluster at `rate`; its timed point. `train.epochs=null`:
    a preset that trains by epochs (the vision presets) would otherwise run its epochs, not STEPS."""
    run_dir = scratch / f"lion32-{rate}"
    cmd = [sys.executable, "-m", "src.launch.emulate", f"nodes={nodes}", f"nproc_per_node={nproc_per_node}",
           f"rate={rate}bit", "--", *overrides, "variant=lion32", f"train.steps={STEPS}", "train.epochs=null",
           f"train.timing_skip={TIMING_SKIP}", "train.eval_every=0", "train.eval_at_start=false",
           "train.eval_batches=1", "train.progress=false", "checkpoint.every=0", "logger=local", f"run.dir={run_dir}"]
    log = scratch / f"lion32-{rate}.log"
    start = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    if code != 0:
        lines = log.read_text().strip().splitlines()
        tail = next((ln for ln in lines if "lioncub: " in ln), " | ".join(lines[-3:]))
        raise CalibrationError(f"the calibration run at {rate} bit/s failed (exit {code}): {tail}")
    point = timed_point(run_dir, rate)
    say(f"calibrate: Lion 32-bit at {rate / 1e6:.1f} Mbit/s: communicate {1000 * point.communicate:.0f} ms of "
        f"{1000 * point.total:.0f} ms ({100 * point.share:.1f} %) [{time.perf_counter() - start:.0f} s]")
    return point


def calibrate(network: str, overrides: list[str], nodes: int, nproc_per_node: int, share: float | None = None,
              runner=run_lion32, say=print, known: list[Point] | None = None) -> dict:
    """Find the rate; returns the calibration record (not yet written). `runner(rate, ...)` trains one point;
    `known` points (another link's calibration of the same setting) replace the first two runs."""
    share = paper_share(network) if share is None else share
    if not 0 < share < 1:
        raise CalibrationError(f"share={share} must lie strictly between 0 and 1")
    scratch = Path(tempfile.mkdtemp(prefix="lcub-calibrate-"))
    try:
        points = list(known or [])[:4]
        if len(points) < 2:
            points = [runner(FIRST_RATE, overrides, nodes, nproc_per_node, scratch, say)]
            if abs(points[0].share - share) > TOLERANCE:
                points.append(runner(guess_rate(points[0], share), overrides, nodes, nproc_per_node, scratch, say))
        verified = within(points, share)
        for _ in range(MAX_REFITS + 1):
            a, k = fit_all(points)
            compute = recent_compute(points)
            if verified is not None:
                break
            rate = solve(share, a, k, compute)
            if any(p.rate == rate for p in points):  # the fit lands on a run that missed: the load moved
                rate += 1000
            points.append(runner(rate, overrides, nodes, nproc_per_node, scratch, say))
            verified = within(points, share)
        if verified is None:
            nearest = min(points, key=lambda p: abs(p.share - share))
            raise CalibrationError(f"after {len(points)} runs the nearest share was {100 * nearest.share:.1f} %, not "
                                   f"{100 * share:.1f} % (the machine's load moved the step's compute between "
                                   f"{1000 * min(p.compute for p in points):.0f} and "
                                   f"{1000 * max(p.compute for p in points):.0f} ms); rerun with --force when it "
                                   "is quieter")
        rate = verified.rate
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"network": network, "target_share": round(share, 4),
            "rate": rate, "rate_tc": f"{rate}bit", "verified_share": round(verified.share, 4),
            "fit": {"a_ms": round(1000 * a, 3), "k_bits": round(k), "compute_ms": round(1000 * compute, 2)},
            "runs": [p.record() for p in points], "machine": machine(), "nodes": nodes,
            "nproc_per_node": nproc_per_node, "setting": overrides, "steps_per_run": STEPS,
            "timing_skip": TIMING_SKIP, "load_average_1min": round(os.getloadavg()[0], 2),
            "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def within(points: list[Point], share: float) -> Point | None:
    """The latest run whose share lies within `TOLERANCE` of the target, if any."""
    return next((p for p in reversed(points) if abs(p.share - share) <= TOLERANCE), None)


def write_atomically(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cached_or_calibrate(network: str, job_args: list[str], nodes: int, nproc_per_node: int, force: bool = False,
                        where: Path = CACHE_DIR, say=print) -> tuple[Path, dict]:
    """The calibration file of this machine, cluster shape and setting: read if cached, else measured and written."""
    overrides = setting(job_args)
    path = cache_path(network, nodes, nproc_per_node, overrides, where)
    if path.is_file() and not force:
        record = json.loads(path.read_text())
        say(f"calibrate: {network} = {record['rate'] / 1e6:.1f} Mbit/s (Lion 32-bit "
            f"{100 * record['verified_share']:.1f} % communication, target {100 * record['target_share']:.1f} %), "
            f"cached in {path}")
        return path, record
    from src.launch.netns import check_prerequisites  # root, ip and tc: before any run starts

    check_prerequisites()
    say(f"calibrate: {network}: finding the link rate at which Lion 32-bit communicates "
        f"{100 * paper_share(network):.1f} % of a step ({nodes} hosts x {nproc_per_node} ranks, "
        f"setting {' '.join(overrides) or '(defaults)'}); a few short runs")
    known = sibling_points(path)
    if known:
        say(f"calibrate: starting from the {len(known)} runs of this setting's other link calibration")
    data = [a for a in job_args if a.startswith("data.dir=")]  # where the data is: not the setting, but needed
    record = {**calibrate(network, overrides + data, nodes, nproc_per_node, say=say, known=known), "setting": overrides}
    write_atomically(path, record)
    say(f"calibrate: {network} = {record['rate'] / 1e6:.1f} Mbit/s gives {100 * record['verified_share']:.1f} % "
        f"(target {100 * record['target_share']:.1f} %); written to {path}")
    return path, record


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    head, tail = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    opts = {"network": "paper_ethernet", "nodes": "2", "nproc_per_node": "2", "force": False}
    for item in head:
        if item in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if item == "--force":
            opts["force"] = True
        elif "=" in item and item.split("=", 1)[0] in opts:
            opts[item.split("=", 1)[0]] = item.split("=", 1)[1]
        else:
            raise CalibrationError(f"unexpected argument {item!r}; give network=, nodes=, nproc_per_node=, --force, "
                                   "and the training overrides after --")
    return opts, tail


def main(argv: list[str] | None = None) -> int:
    from src.launch.netns import EmulatorUnavailable, NetnsError

    try:
        opts, job = parse(sys.argv[1:] if argv is None else argv)
        paper_share(opts["network"])
        path, record = cached_or_calibrate(opts["network"], job, int(opts["nodes"]), int(opts["nproc_per_node"]),
                                           force=opts["force"])
    except (CalibrationError, EmulatorUnavailable, NetnsError, ValueError) as exc:
        print(f"lcub: error: {exc}", file=sys.stderr)
        return 2
    print(f"{record['rate_tc']} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
