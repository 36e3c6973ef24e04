"""Build the packaged Megatron Bridge recipe corpus (server/mbridge_perf/config/recipe_data/).

Reads ../shared/data/bridge-recipes (Bridge 0.6.2 ``ConfigContainer.to_yaml()`` dumps, the
recipe index and Bridge's recorded ``estimate_training_memory`` results) and writes one
``bridge-recipes.tar.xz`` holding ``yaml/<recipe>.yaml`` exactly as given, ``index.json`` (per
recipe: model, task, GPU count, GPU, precision, variant and layout, read from the dump) and
``bridge_estimates.csv``. Deterministic: the same inputs give the same bytes.

    python scripts/build_recipe_data.py [--src DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT.parent / "shared" / "data" / "bridge-recipes"
OUT = ROOT / "server" / "mbridge_perf" / "config" / "recipe_data" / "bridge-recipes.tar.xz"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_LAYOUT = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
           "vpp": "virtual_pipeline_model_parallel_size", "cp": "context_parallel_size",
           "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size"}


def _entry(name: str, dump: dict[str, Any], row: dict[str, str]) -> dict[str, Any]:
    model = dump.get("model") or {}
    train = dump.get("train") or {}
    layout = {k: model.get(v) for k, v in _LAYOUT.items()}
    layout.update(mbs=train.get("micro_batch_size"), gbs=train.get("global_batch_size"),
                  seq=model.get("seq_length"))
    return {"model_id": row.get("model_id") or None, "module": row.get("module") or None,
            "layout": layout}


def build(src: Path) -> bytes:
    rows = {r["recipe"]: r for r in csv.DictReader(io.StringIO(
        (src / "recipe_index.csv").read_text("utf-8")))}
    texts = {p.stem: p.read_text("utf-8") for p in sorted((src / "yaml").glob("*.yaml"))}
    index = {n: _entry(n, yaml.load(t, Loader=LOADER) or {}, rows.get(n, {}))
             for n, t in texts.items()}
    files = {"index.json": json.dumps(index, sort_keys=True, separators=(",", ":")),
             "bridge_estimates.csv": (src / "bridge_estimates.csv").read_text("utf-8")}
    files.update({f"yaml/{n}.yaml": t for n, t in texts.items()})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tf:
        for path, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=SRC)
    args = ap.parse_args(argv)
    data = build(args.src)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(data)
    print(f"{OUT.relative_to(ROOT)}: {len(data):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
