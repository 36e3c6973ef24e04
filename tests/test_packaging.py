"""A wheel carries the schemas and the skill pack: an installed server needs no checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import REPO, SKILL_NAMES, tool_env


def test_wheel_bundles_schemas_and_pack_and_serves_from_it(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("mbridge_perf-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for schema in ("skill_card", "evals", "pack_card"):
        assert f"mbridge_perf/skillpack/schemas/{schema}.schema.json" in names
    for skill in SKILL_NAMES:
        for rel in ("SKILL.md", "card.yaml", "evals/evals.json"):
            assert f"mbridge_perf/_pack/skills/{skill}/{rel}" in names
    assert "mbridge_perf/_pack/card.yaml" in names
    for data in ("bridge-recipes.tar.xz", "NOTICE"):  # Bridge recipes by name, offline
        assert f"mbridge_perf/config/recipe_data/{data}" in names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    probe = ("from mbridge_perf.skillpack.pack import find_pack_root, list_skills;"
             "from mbridge_perf.skillpack.lint import lint;"
             "from mbridge_perf.config.recipes import recipe_index;"
             "r = find_pack_root(); print(r); print(len(list_skills(r)));"
             "print(sum(f.severity == 'error' for f in lint(r))); print(len(recipe_index()))")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(target)!r}); {probe}"], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env=tool_env(), timeout=60).stdout.split()
    assert out[0].startswith(str(target)) and out[0].endswith("_pack")
    assert out[1:] == [str(len(SKILL_NAMES)), "0", "406"]
