"""MCP wiring only: resources (and, in later steps, tools and prompts) that call into the
package. No logic lives here that the CLI cannot reach."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mcp.server.mcpserver import MCPServer

from mbridge_perf import __version__
from mbridge_perf.skillpack.pack import CARD_FILE, SKILL_FILE, find_pack_root, list_skills

INSTRUCTIONS = (
    "Megatron Bridge training-performance skills. Read skill://<name>/SKILL.md for the "
    "checklist that fits the question (GPU OOM and memory, activation recompute, long-context "
    "MoE, MoE optimisation workflow) and skill://<name>/card.yaml for its machine-readable facts."
)


def _reader(path: Path) -> Callable[[], str]:
    def read() -> str:
        return path.read_text(encoding="utf-8")

    return read


def build_server(pack_root: Path | None = None) -> MCPServer:
    """Build the server over a pack; files are read on each request so edits show at once."""
    root = pack_root or find_pack_root()
    server = MCPServer("mbridge-perf", version=__version__, instructions=INSTRUCTIONS)
    for skill in list_skills(root):
        name = skill.folder_name
        desc = str(skill.frontmatter.get("description", ""))
        server.resource(f"skill://{name}/SKILL.md", name=f"{name}/SKILL.md",
                        title=f"{name} (SKILL.md)", description=desc,
                        mime_type="text/markdown")(_reader(skill.path / SKILL_FILE))
        server.resource(f"skill://{name}/card.yaml", name=f"{name}/card.yaml",
                        title=f"{name} (card.yaml)",
                        description=f"Machine-readable card of {name}: checklist, measured "
                                    "results, constraints.",
                        mime_type="application/yaml")(_reader(skill.path / CARD_FILE))
    return server
