"""Where the runs of a submission stand: `python -m slurm.status SUBMISSION_FOLDER | NAME [--root DIR]`.

One line per run: finished, running, pending (with Slurm's reason), requeued, failed or cancelled (and why) or
unknown, the step it reached out of `train.steps`, and the job id. Sources, in this order of trust: the run folder
(`summary.json` without `interrupted_at` = finished; the last step of `metrics.jsonl`), squeue (pending and running
jobs), sacct when the cluster keeps accounting, else `scontrol show job` (finished jobs Slurm still remembers), the job script's records
in `jobs/<run>-<job>.jsonl` (each attempt's exit status, whether it requeued) and the most telling line of the last
attempt in the job's log (lioncub's own message, a Python exception, Slurm's cancellation). NAME picks the newest
`<root>/<NAME>-*` submission (root: runs/slurm). Deliberate difference from squeue: one line per run, not per job.
Exit status 0 when no run failed, 1 otherwise, 2 when the submission cannot be read.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from slurm.runs import REPO

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}


@dataclass
class RunStatus:
    run: str
    job: str | None
    state: str
    step: str
    detail: str


def _query(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def queue_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (state, reason)} of our jobs in squeue (array tasks one by one)."""
    out = _query(["squeue", "-h", "-r", "--me", "-o", "%i|%T|%r"]) or ""
    wanted = set(job_ids) | {j.split("_")[0] for j in job_ids}
    found = {}
    for line in out.splitlines():
        job, state, reason = (line.split("|") + ["", ""])[:3]
        if job in wanted or job.split("_")[0] in wanted:
            found[job] = (state, reason)
    return found


def ended_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """{job id: (state, "exit code/reason")} of ended jobs, from sacct or else scontrol's memory of them."""
    found: dict[str, tuple[str, str]] = {}
    out = _query(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,Reason",
                  *[a for j in sorted({j.split("_")[0] for j in job_ids}) for a in ("-j", j)]])
    for line in (out or "").splitlines():
        job, state, code, reason = (line.split("|") + ["", "", ""])[:4]
        found[job] = (state.split()[0] if state else "", f"exit code {code}" + (f", {reason}" if reason not in
                                                                                 ("", "None") else ""))
    for job in job_ids:
        if job in found:
            continue
        text = _query(["scontrol", "show", "job", "-o", job]) or ""
        fields = dict(re.findall(r"(\w+)=(\S*)", text))
        if fields.get("JobState"):
            reason = fields.get("Reason", "None")
            found[job] = (fields["JobState"], f"exit code {fields.get('ExitCode', '?')}"
                          + (f", {reason}" if reason != "None" else ""))
    return found


def _last_records(folder: Path, run: str, job: str) -> list[dict]:
    path = folder / "jobs" / f"{run}-{job}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _progress(run_dir: Path) -> tuple[int | None, int | None]:
    """(last step in metrics.jsonl, train.steps of config.yaml)."""
    last = total = None
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in reversed(metrics.read_text().splitlines()):
            if line.strip():
                last = json.loads(line).get("step")
                break
    config = run_dir / "config.yaml"
    if config.is_file():
        total = (yaml.safe_load(config.read_text()) or {}).get("train", {}).get("steps")
    return last, total


# What explains a failure best, first: lioncub's own message, a Python exception (the first: the ranks' own come
# before torchrun's ChildFailedError), Slurm's cancellation, srun's error.
_REASONS = ((r"lioncub: (cannot|training stopped)", -1), (r"^(?!.*ChildFailedError)[\w.]*(Error|Exception): ", 0),
            (r"\*\*\* .*(CANCELLED|DUE TO)", -1), (r"srun: error|slurmstepd: error", -1))


def _log_reason(log: Path) -> str:
    """The most telling line of the last attempt in a job's log (see _REASONS), or its last line."""
    if not log.is_file():
        return ""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("lioncub: run ")]
    lines = lines[starts[-1]:] if starts else lines
    for pattern, which in _REASONS:
        telling = [line for line in lines if re.search(pattern, line)]
        if telling:
            return telling[which][:200]
    return lines[-1][:200] if lines else ""


def log_path(folder: Path, job: dict, job_id: str) -> Path:
    name = job["log"].replace("%A", job_id.split("_")[0]).replace("%a", job_id.split("_")[-1])
    return folder / "logs" / name.replace("%j", job_id)


def run_status(folder: Path, job: dict, run: dict, queue: dict, ended: dict) -> RunStatus:
    base = job.get("job_id")
    job_id = None if base is None else (f"{base}_{run['index']}" if job["array"] else str(base))
    run_dir = folder / f"{run['name']}-{job_id}"
    last, total = _progress(run_dir)
    step = f"{last if last is not None else '-'}/{total if total is not None else '?'}"
    if job_id is None:
        return RunStatus(run["name"], None, "unsubmitted", step, "sbatch failed or was never called for this job")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    if summary and summary.get("interrupted_at") is None:  # an interrupted run writes one too, with the step
        return RunStatus(run["name"], job_id, "finished", step,
                         f"final loss {summary.get('final_loss', float('nan')):.4f}, {run_dir}")
    live = queue.get(job_id) or (queue.get(str(base)) if job["array"] else None)
    records = _last_records(folder, run["name"], job_id)
    attempts = sum(1 for r in records if r.get("event") == "start")
    if live and live[0] in LIVE:
        state = {"REQUEUED": "requeued", "REQUEUE_HOLD": "requeued"}.get(live[0], live[0].lower())
        again = f"attempt {attempts + (state in ('pending', 'requeued'))}" if attempts else ""
        return RunStatus(run["name"], job_id, state, step, ", ".join(x for x in (again, f"reason {live[1]}"
                                                                                   if live[1] not in ("", "None")
                                                                                   else "") if x))
    end = next((r for r in reversed(records) if r.get("event") == "end"), None)
    slurm_state, slurm_detail = ended.get(job_id, ("", ""))
    why = [f"Slurm: {slurm_state} ({slurm_detail})" if slurm_state else "",
           f"last attempt exited with {end['status']}" if end else "", _log_reason(log_path(folder, job, job_id))]
    if not records and not slurm_state:
        why[0] = "not in the queue and never started (cancelled while pending?)"
    state = "cancelled" if slurm_state.startswith("CANCELLED") else "failed" if records or slurm_state else "unknown"
    return RunStatus(run["name"], job_id, state, step,
                     "; ".join(w for w in why if w))


def find_submission(what: str, root: Path) -> Path:
    path = Path(what)
    if (path / "submission.json").is_file():
        return path
    candidates = sorted(p for p in root.glob(f"{what}-*") if (p / "submission.json").is_file())
    if not candidates:
        raise FileNotFoundError(f"{what}: neither a submission folder (no submission.json) nor the name of one under "
                                f"{root}")
    return candidates[-1]


def status(folder: Path) -> list[RunStatus]:
    sub = json.loads((folder / "submission.json").read_text())
    ids = [f"{j['job_id']}_{r['index']}" if j["array"] else str(j["job_id"])
           for j in sub["jobs"] if j.get("job_id") for r in j["runs"]]
    queue = queue_states(ids)
    ended = ended_states([i for i in ids if i not in queue])
    return [run_status(folder, job, run, queue, ended) for job in sub["jobs"] for run in job["runs"]]


def format_table(rows: list[RunStatus]) -> str:
    head = ("run", "job", "state", "step", "detail")
    cells = [head] + [(r.run, r.job or "-", r.state, r.step, r.detail) for r in rows]
    widths = [max(len(str(c[i])) for c in cells) for i in range(4)]
    return "\n".join("  ".join(str(c[i]).ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.status", description=__doc__.split("\n\n")[0])
    parser.add_argument("submission", help="a submission folder, or a submission name (the newest one)")
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "slurm", help="where named submissions are")
    args = parser.parse_args(argv)
    try:
        folder = find_submission(args.submission, args.root)
        rows = status(folder)
    except (FileNotFoundError, json.JSONDecodeError, KeyError) as exc:
        print(f"slurm.status: {exc}", file=sys.stderr)
        return 2
    counts = {s: sum(r.state == s for r in rows) for s in dict.fromkeys(r.state for r in rows)}
    print(f"{folder}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(format_table(rows))
    return 1 if any(r.state in ("failed", "cancelled", "unknown", "unsubmitted") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
