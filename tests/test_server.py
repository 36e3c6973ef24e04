"""The MCP server over the real protocol: in memory, and the installed command over stdio."""

from __future__ import annotations

import sys

import pytest
from mcp import Client, StdioServerParameters

from mbridge_perf.server import build_server

from helpers import REPO, SKILL_NAMES, tool

pytestmark = pytest.mark.anyio

EXPECTED_URIS = {f"skill://{n}/{f}" for n in SKILL_NAMES for f in ("SKILL.md", "card.yaml")}


async def test_lists_skill_md_and_card_of_every_skill() -> None:
    async with Client(build_server(REPO), raise_exceptions=True) as client:
        resources = (await client.list_resources()).resources
    assert {str(r.uri) for r in resources} == EXPECTED_URIS
    mimes = {str(r.uri).rsplit("/", 1)[1]: r.mime_type for r in resources}
    assert mimes == {"SKILL.md": "text/markdown", "card.yaml": "application/yaml"}


async def test_reads_return_the_files_on_disk() -> None:
    async with Client(build_server(REPO), raise_exceptions=True) as client:
        for name in SKILL_NAMES:
            for rel in ("SKILL.md", "card.yaml"):
                result = await client.read_resource(f"skill://{name}/{rel}")
                text = result.contents[0].text
                assert text == (REPO / "skills" / name / rel).read_text(encoding="utf-8")


async def test_unknown_skill_resource_is_a_clear_error() -> None:
    async with Client(build_server(REPO)) as client:
        with pytest.raises(Exception, match=r"(?i)unknown resource|not found"):
            await client.read_resource("skill://no-such-skill/SKILL.md")


async def test_installed_console_script_serves_over_stdio() -> None:
    params = StdioServerParameters(command=tool("mbridge-perf"), args=["serve"], cwd=str(REPO))
    async with Client(params) as client:
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        card = await client.read_resource(
            "skill://nemo-mbridge-perf-memory-tuning/card.yaml")
    assert uris == EXPECTED_URIS
    assert "answer_checklist:" in card.contents[0].text


def test_pin_on_the_mcp_sdk_is_major_2() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "mcp>=2.3,<3" in deps
    assert sys.version_info >= (3, 11)
