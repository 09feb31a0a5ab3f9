"""Numbers the Lion Cub paper (arXiv:2411.16462) publishes, drawn beside ours and always labelled as the paper's.

- TABLE2: Table 2, percent of update elements by the sign of standard Lion's direction (rows) and of the majority
  vote (columns), at the 3000th iteration of a GPT (730M), for 4 and 8 workers.
- TABLE_A1: Table A.1, per-step milliseconds of GPT training on H100 nodes (batch 12; 8 for 1558M).
These are quotations of the paper, not measurements of this harness.
"""
from __future__ import annotations

SIGNS = ("pos", "neg", "zero")

# TABLE2[workers][(lion, vote)] in percent.
TABLE2 = {
    4: {("pos", "pos"): 29.15, ("pos", "neg"): 2.26, ("pos", "zero"): 18.59,
        ("neg", "pos"): 2.26, ("neg", "neg"): 29.14, ("neg", "zero"): 18.59,
        ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0},
    8: {("pos", "pos"): 32.08, ("pos", "neg"): 4.34, ("pos", "zero"): 13.54,
        ("neg", "pos"): 4.34, ("neg", "neg"): 32.13, ("neg", "zero"): 13.56,
        ("zero", "pos"): 0.0, ("zero", "neg"): 0.0, ("zero", "zero"): 0.0},
}

TABLE_A1_COLUMNS = ("network", "optimizer", "nodes", "gpus", "params", "batch", "forward_ms", "backward_ms",
                    "update_ms", "communicate_ms", "total_ms")
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


def _row(line: str) -> dict:
    cells = line.split("|")
    row = dict(zip(TABLE_A1_COLUMNS, cells))
    for key in ("nodes", "gpus", "batch"):
        row[key] = int(row[key])
    for key in TABLE_A1_COLUMNS[6:]:
        row[key] = float(row[key])
    return row


TABLE_A1 = [_row(line) for line in _A1.splitlines()]
