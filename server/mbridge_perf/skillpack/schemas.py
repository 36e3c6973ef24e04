"""The JSON Schemas shipped with the package (skill card, evals.json, pack card)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Literal

SchemaName = Literal["skill_card", "evals", "pack_card"]


@cache
def load_schema(name: SchemaName) -> dict[str, Any]:
    """Return a schema by short name; cached because lint runs it once per skill."""
    text = resources.files("mbridge_perf.skillpack").joinpath(
        f"schemas/{name}.schema.json"
    ).read_text(encoding="utf-8")
    return json.loads(text)
