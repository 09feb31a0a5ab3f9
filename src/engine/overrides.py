"""Command-line overrides read before Hydra composes them, so that a typo gets lioncub's one line, not Hydra's.

Two mistakes Hydra reports in its own words (exit status 1, on every rank of a torchrun job):
- a plain override of a key the configuration does not have (`optim.lrr=1`), for which Hydra advises appending it
  (`+optim.lrr=1`), the wrong fix for a typo. `with_schema_keys` rewrites such an override to `++optim.lrr=1`
  when the typed schema (src.engine.schema) knows the key is unknown, and any override of a key of the reducer's
  mapping (`variant.reducer.module=...`: `make_reducer` checks those, naming the reducer's options); Hydra then composes, and the schema check of
  `preflight` reports it in the same line as for `+optim.lrr=1`: `optim.lrr=1: unknown key; did you mean optim.lr?`
  (exit 2, rank 0 only). `++` adds or overrides, so a rewrite never changes what a valid override does.
- an option of a config group that does not exist (`+exp=nope`, `data=cifar10`), which Hydra answers with the whole
  list of options and its search path. `group_problems` gives one line per such override, with the near matches.

Both read the overrides as Hydra's own parser does; arguments it cannot parse, flags (`-m`, `--cfg`) and `hydra`
keys are left to Hydra.
"""
from __future__ import annotations

import difflib
from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"
# mappings whose keys their owner checks by name (src.comm.make_reducer names a reducer's options): an override of a
# key the variant's YAML leaves out (`variant.reducer.module=...`, or a typo) is added, for that check to answer
CHECKED_BY_OWNER = ("variant.reducer.",)
_WORDS = {"exp": "preset"}


def _parse(arg: str):
    """Hydra's reading of one command-line argument, or None (a flag, or something Hydra will report itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if arg.startswith("-") or "=" not in arg:
        return None
    try:
        return OverridesParser.create().parse_override(arg)
    except HydraException:
        return None


def _is_group(key: str, conf: Path) -> bool:
    return not key.startswith("hydra") and (conf / key).is_dir()


def options(group: str, conf: Path = CONF) -> list[str]:
    """The options of config group `group` (conf/<group>/*.yaml)."""
    return sorted(p.stem for p in (conf / group).glob("*.yaml"))


def near(name: str, known: list[str], n: int = 5) -> list[str]:
    """The known names closest to `name`: containing it first, then by similarity."""
    within = [k for k in known if name and name in k]
    close = difflib.get_close_matches(name, known, n=n, cutoff=0.5)
    return list(dict.fromkeys(within + close))[:n]


def search_dirs(args: list[str]) -> list[Path] | None:
    """The config folders a `hydra.searchpath=[...]` argument adds (`file://` or plain paths: a user's variants
    outside the repository); None when it names another kind (`pkg://`), whose options only Hydra can see."""
    found = []
    for arg in args:
        parsed = _parse(arg)
        if parsed is None or parsed.key_or_group != "hydra.searchpath":
            continue
        value = parsed.value()
        for entry in value if isinstance(value, list) else [value]:
            if "://" in str(entry) and not str(entry).startswith("file://"):
                return None
            found.append(Path(str(entry).removeprefix("file://")))
    return found


def group_problem(override, conf: Path = CONF, extra: list[Path] = ()) -> str | None:
    """One line when `override` chooses an option its config group does not have in `conf` or the `extra` config
    folders (None: it has them all)."""
    group = override.key_or_group
    if override.is_delete() or not _is_group(group, conf):
        return None
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
    known = sorted({o for folder in (conf, *extra) for o in options(group, folder)})
    missing = [v for v in values if isinstance(v, str)
               and not any((folder / group / f"{v}.yaml").is_file() for folder in (conf, *extra))]
    if not missing or not known:
        return None
    what = _WORDS.get(group, f"{group} option")
    hints = near(missing[0], known)
    hint = f"did you mean {', '.join(hints)}?" if hints else f"the {len(known)} options are in conf/{group}/"
    return (f"{override.input_line}: no {what} {missing[0]!r} (no conf/{group}/{missing[0]}.yaml); {hint}"
            + (" (python -m experiments.manifest lists the figures' runs)" if group == "exp" else ""))


def group_problems(args: list[str], conf: Path = CONF) -> list[str]:
    """One line per argument that chooses a config group option which does not exist."""
    extra = search_dirs(args)
    if extra is None:
        return []
    found = []
    for arg in args:
        parsed = _parse(arg)
        problem = group_problem(parsed, conf, extra) if parsed is not None else None
        found += [problem] if problem else []
    return found


def with_schema_keys(args: list[str], conf: Path = CONF) -> list[str]:
    """`args` with each plain override of a key the schema does not know written as `++key=value` (see above)."""
    from src.engine.schema import is_unknown_key

    out = []
    for arg in args:
        parsed = _parse(arg)
        plain = parsed is not None and not (parsed.is_add() or parsed.is_force_add() or parsed.is_delete())
        key = parsed.key_or_group if plain else ""
        if plain and not key.startswith("hydra") and not _is_group(key, conf) and (
                is_unknown_key(key) or key.startswith(CHECKED_BY_OWNER)):
            arg = "++" + arg
        out.append(arg)
    return out
