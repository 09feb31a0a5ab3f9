"""Table A.1 of the Lion Cub paper (arXiv:2411.16462, Appendix A.1, "Profiling results from training GPT"): per-step
milliseconds of GPT training on H100 nodes (4 GPUs per node; batch 12 per GPU, 8 for 1558M; sequence 1024).

The one place the table is written down: analysis/ (figures) and src/bench/gpu_check (the GPU check's references
and its projection of our GPU measurements to the paper's scale) read it from here. These are quotations of the
paper, not measurements of this harness. Columns: forward, backward, update step (quantization included, the wire
excluded), communication and the whole step ("All Time"), in ms.

`rows(...)` selects rows; `OPTIMIZERS` maps our variant names (conf/variant/) to the paper's optimizer names.
`GPUS_PER_NODE`: Section 7's "each compute node has four NVIDIA H100 GPUs" (Fig. 12: "8 workers on 2 nodes"; Fig.
A.2: 16 GPUs on 4 nodes); the table's "Num GPUs" column, quoted as printed, reads 4 at 2 nodes and 8 at 4 nodes.
Some configurations appear in several rows (repeated runs: 774M on 4 nodes has two Lion 32-bit and three Lion Cub
4-bit rows; 1558M on InfiniBand two Lion Cub 8-bit rows); `mean_row` averages them, column by column.
"""
from __future__ import annotations

TABLE_A1_COLUMNS = ("network", "optimizer", "nodes", "gpus", "params", "batch", "forward_ms", "backward_ms",
                    "update_ms", "communicate_ms", "total_ms")
TIMES = TABLE_A1_COLUMNS[6:]
_A1 = """\
Ethernet|Lion (32bit)|2|4|350M|12|12.2|48.9|6.8|344.0|411.9
Ethernet|Lion (16bit)|2|4|350M|12|12.2|48.4|6.8|180.8|248.2
Ethernet|Lion Cub (8bit)|2|4|350M|12|12.3|48.6|23.1|87.7|171.7
Ethernet|Lion Cub (4bit)|2|4|350M|12|12.3|49.0|13.9|48.9|124.0
Ethernet|Lion (32bit)|2|4|774M|12|18.6|134.2|21.5|756.3|930.6
Ethernet|Lion (16bit)|2|4|774M|12|18.4|134.5|21.4|404.6|578.9
Ethernet|Lion Cub (8bit)|2|4|774M|12|18.4|134.2|49.5|195.9|398.0
Ethernet|Lion Cub (4bit)|2|4|774M|12|18.5|133.9|28.5|117.0|297.9
Ethernet|Lion Cub (1bit)|2|4|774M|12|19.0|134.4|70.1|142.7|366.3
Ethernet|Lion (32bit)|4|8|774M|12|18.6|134.2|21.9|1421.5|1596.2
Ethernet|Lion (32bit)|4|8|774M|12|18.2|133.8|21.4|1435.9|1609.3
Ethernet|Lion Cub (8bit)|4|8|774M|12|18.4|134.6|49.4|336.4|538.7
Ethernet|Lion Cub (4bit)|4|8|774M|12|18.6|132.2|28.5|275.7|455.0
Ethernet|Lion Cub (4bit)|4|8|774M|12|18.4|131.0|28.5|211.9|389.8
Ethernet|Lion Cub (4bit)|4|8|774M|12|18.7|131.6|28.6|252.9|431.8
Ethernet|Lion Cub (1bit)|4|8|774M|12|19.4|134.5|69.9|162.5|386.3
Ethernet|Lion (32bit)|2|4|1558M|8|36.6|189.2|50.4|2299.4|2575.7
Ethernet|Lion Cub (8bit)|2|4|1558M|8|36.3|189.6|103.4|411.6|740.9
Ethernet|Lion Cub (4bit)|2|4|1558M|8|36.2|189.5|57.9|216.8|500.5
InfiniBand|Lion (32bit)|2|4|1558M|8|36.2|189.1|50.1|159.5|435.0
InfiniBand|Lion Cub (8bit)|2|4|1558M|8|36.1|189.4|57.8|25.3|308.6
InfiniBand|Lion Cub (8bit)|2|4|1558M|8|36.0|188.3|58.0|25.2|307.5
InfiniBand|Lion Cub (4bit)|2|4|1558M|8|36.3|189.3|57.9|44.5|327.9"""
GPUS_PER_NODE = 4
OPTIMIZERS = {"lion32": "Lion (32bit)", "lion16": "Lion (16bit)", "cub8": "Lion Cub (8bit)",
              "cub4": "Lion Cub (4bit)", "cub1": "Lion Cub (1bit)"}


def _row(line: str) -> dict:
    row = dict(zip(TABLE_A1_COLUMNS, line.split("|")))
    for key in ("nodes", "gpus", "batch"):
        row[key] = int(row[key])
    for key in TIMES:
        row[key] = float(row[key])
    return row


TABLE_A1 = [_row(line) for line in _A1.splitlines()]


def rows(**where) -> list[dict]:
    """The rows whose columns equal `where` (e.g. `rows(params="774M", nodes=2)`), in the paper's order."""
    return [r for r in TABLE_A1 if all(r[k] == v for k, v in where.items())]


def mean_row(selected: list[dict]) -> dict:
    """One row from rows of one configuration: the first row's labels, every time column averaged (`runs`: how
    many rows were averaged)."""
    if not selected:
        raise ValueError("Table A.1: no row to average")
    out = {**selected[0], "runs": len(selected)}
    for key in TIMES:
        out[key] = sum(r[key] for r in selected) / len(selected)
    return out
