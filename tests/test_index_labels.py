"""The index of `make figures` labels a manifest's caption and finding by whose they are: the paper's for the
manifests of experiments/ (however the path to one is written), the user's for a manifest of their own, read from
a YAML file elsewhere (here a temporary folder); decided by where the file lives (`Manifest.from_paper`)."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from experiments.index import FigureEntry, text_label, write_index
from experiments.manifest import HERE, REPO, load_manifest


def own_manifest(folder: Path) -> Path:
    data = {"name": "mine", "figure": "Fig. 5", "figure_title": "my quantizer's sign match",
            "caption": "My quantizer keeps the sign.", "finding": "It matches Lion more often than L1.",
            "analysis": "analysis.fig5",
            "scales": {"laptop": {"runs": [{"name": "q", "nproc_per_node": 4, "overrides": ["+exp=laptop"]}]}}}
    path = folder / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def section(index: str, heading: str) -> str:
    part = index.split(heading, 1)[1]
    return part.split("\n## ", 1)[0]


def test_own_manifest_text_is_labelled_yours_and_the_papers_stays_the_papers(tmp_path, monkeypatch):
    mine = load_manifest(own_manifest(tmp_path), "laptop")
    monkeypatch.chdir(REPO)
    papers = load_manifest(os.path.join("experiments", "fig5.yaml"), "laptop")  # a relative path to experiments/
    assert not mine.from_paper and papers.from_paper and load_manifest("fig5", "laptop").from_paper
    out = tmp_path / "figures"
    entries = [FigureEntry(m, out / m.name, returncode=1, message="test: not drawn") for m in (papers, mine)]
    index = (write_index(entries, out, 1.0)).read_text()

    own = section(index, "## Fig. 5: my quantizer's sign match")
    assert "> **Your manifest's caption (not the paper's).** My quantizer keeps the sign." in own
    assert "> **Your manifest's finding (not the paper's).** It matches Lion more often than L1." in own
    assert "Paper's" not in own and f"your manifest `{tmp_path / 'mine.yaml'}`" in own

    paper = section(index, f"## Fig. 5: {papers.figure_title}")
    assert f"> **Paper's caption.** {papers.caption}" in paper and f"> **Paper's finding.** {papers.finding}" in paper
    assert "Your manifest" not in paper and "manifest `fig5.yaml`" in paper


def test_a_manifest_copied_out_of_experiments_is_yours(tmp_path):
    """The paper's own text, copied into a manifest elsewhere, is no longer vouched for as the paper's."""
    copy = tmp_path / "fig5.yaml"
    copy.write_text((HERE / "fig5.yaml").read_text())
    manifest = load_manifest(copy, "laptop")
    assert not manifest.from_paper
    assert text_label(manifest, "caption") == "Your manifest's caption (not the paper's)"
    assert text_label(load_manifest("fig5", "laptop"), "finding") == "Paper's finding"


def test_the_notebook_labels_an_own_manifest_caption_yours(tmp_path, monkeypatch):
    import IPython.display

    from experiments import notebook

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs: shown.extend(o.data for o in objs))
    assert notebook.show(str(own_manifest(tmp_path)), tmp_path / "runs", tmp_path / "out") is None  # no runs
    assert shown[0] == ("**Fig. 5: my quantizer's sign match.** *Your manifest's caption (not the paper's):* My "
                        "quantizer keeps the sign.")
    assert shown[1].startswith("*Not drawn:* no finished runs of Fig. 5")
