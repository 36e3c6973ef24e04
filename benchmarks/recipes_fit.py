"""Do NVIDIA's own recipes fit? estimate_memory's verdict on every Megatron Bridge 0.6.2
perf-recipe dump, on the GPU and GPU count its name gives, by model family; the recipes Bridge's
published performance tables show running and measured at the dump's own layout apart (they fit:
NVIDIA ran them).

Data: ../shared/data/bridge-recipes (recipe_index.csv, yaml/) and
../shared/data/steptime/bridge_perf_summary.csv (`recipe_dump`, `dump_layout_matches = yes`,
`release`). Prints the figures; asserts nothing (tests/memory/test_recipes_fit.py keeps the
measured list and the share on the packed corpus).
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter, defaultdict
from pathlib import Path

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
if not SHARED.exists():
    SHARED = Path("/work/shared/data")
GPU_TOKEN = re.compile(r"_(\d+)gpu_(h100|b200|b300|gb200|gb300|vr200|r100)_")
NEW_RELEASE = "26.02"


def measured(path: Path) -> dict[str, list[str]]:
    """recipe dump -> releases whose table row ran it at the dump's own layout."""
    out: dict[str, list[str]] = defaultdict(list)
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["recipe_dump"] and row["dump_layout_matches"] == "yes":
                out[row["recipe_dump"]].append(row["release"])
    return dict(out)


def judge(name: str, text: str) -> tuple[str, str]:
    """(verdict, the deciding term) of one dump on the GPU its name gives; a dump that implies
    no world runs on the GPU count of its name (recipe_index.csv: num_gpus_source = name)."""
    match = GPU_TOKEN.search(name)
    assert match is not None
    gpus, gpu = int(match[1]), match[2]
    try:
        cfg = load_config(text=text)
        if cfg.cluster.num_gpus is None:
            cfg = load_config(text=text, overrides=[f"cluster.num_gpus={gpus}"])
        rep = estimate_memory(cfg, gpu=gpu)
    except ConfigError as exc:
        return "refused", str(exc)
    return rep.verdict or "no GPU", rep.verdict_term


def family(name: str) -> str:
    return re.split(r"_(?:pretrain|sft|peft)_", name)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=SHARED)
    args = parser.parse_args()
    index = args.data / "bridge-recipes" / "recipe_index.csv"
    with index.open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["package"] == "megatron.bridge.perf_recipes"
                and GPU_TOKEN.search(r["recipe"])]
    ran = measured(args.data / "steptime" / "bridge_perf_summary.csv")
    results = {r["recipe"]: judge(r["recipe"], (args.data / "bridge-recipes" / "yaml" /
                                                f"{r['recipe']}.yaml").read_text("utf-8"))
               for r in rows}
    _by_family(results)
    _measured(results, ran)
    _overall(results)


def _by_family(results: dict[str, tuple[str, str]]) -> None:
    fams: dict[str, Counter[str]] = defaultdict(Counter)
    for name, (verdict, _) in results.items():
        fams[family(name)][verdict] += 1
    print(f"{'family':34} {'dumps':>5} {'fits':>5} {'tight':>5} {'no':>4} {'refused':>7}")
    for fam, c in sorted(fams.items()):
        print(f"{fam:34} {sum(c.values()):5} {c['fits']:5} {c['tight']:5} "
              f"{c['does_not_fit']:4} {c['refused']:7}")


def _measured(results: dict[str, tuple[str, str]], ran: dict[str, list[str]]) -> None:
    print("\nMeasured at the dump's layout (Bridge performance tables):")
    for label, pick in ((f"rows of {NEW_RELEASE} or newer", lambda rel: max(rel) >= NEW_RELEASE),
                        ("only 25.11 rows", lambda rel: max(rel) < NEW_RELEASE)):
        names = sorted(n for n, rel in ran.items() if n in results and pick(rel))
        c = Counter(results[n][0] for n in names)
        print(f"  {label}: {len(names)} dumps - fits {c['fits']}, tight {c['tight']}, "
              f"does_not_fit {c['does_not_fit']}, refused {c['refused']}")
        for n in names:
            if results[n][0] not in ("fits", "tight"):
                print(f"    {n} ({', '.join(ran[n])}): {results[n][0]} - {results[n][1]}")


def _overall(results: dict[str, tuple[str, str]]) -> None:
    known = {n: v for n, v in results.items()
             if not v[1].startswith(("gpu: R100", "model._target_"))}
    ok = sum(v[0] in ("fits", "tight") for v in known.values())
    print(f"\nAll perf-recipe language-model dumps with a known GPU: {ok} of {len(known)} fit or "
          f"are tight ({ok / len(known):.1%}); R100 (no public capacity) and diffusion dumps "
          f"left out: {len(results) - len(known)}")
    for n, (verdict, term) in sorted(known.items()):
        if verdict not in ("fits", "tight"):
            print(f"  {n}: {verdict} - {term}")


if __name__ == "__main__":
    main()
