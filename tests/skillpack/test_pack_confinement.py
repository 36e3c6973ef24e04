"""Pack files are read only inside the pack: a `references/` folder, a reference or a
SKILL.md that is a symlink out of the pack is never served or read (issue 23)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mcp import Client

from mbridge_perf.server import build_server
from mbridge_perf.skillpack.pack import PackError, get_skill, read_pack_text

from helpers import REPO

MEM = "nemo-mbridge-perf-memory-tuning"
SECRET = "root:x:0:0:SECRET-OUTSIDE-THE-PACK\n"
pytestmark = pytest.mark.anyio


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    root = tmp_path / "pack"
    shutil.copytree(REPO / "skills", root / "skills")
    shutil.copy2(REPO / "card.yaml", root / "card.yaml")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd.md").write_text(SECRET)
    return root


def _texts(contents: list) -> str:  # type: ignore[type-arg]
    return "".join(getattr(c, "text", "") for c in contents)


async def _served(root: Path) -> tuple[set[str], list[str]]:
    async with Client(build_server(root)) as c:
        uris = {str(r.uri) for r in (await c.list_resources()).resources}
        texts = []
        for uri in sorted(uris):
            if uri.startswith("skill://"):
                try:
                    texts.append(_texts((await c.read_resource(uri)).contents))
                except Exception as exc:  # a refused read is an error, never the file
                    texts.append(str(exc))
        return uris, texts


async def test_a_references_folder_symlinked_out_is_not_served(pack: Path) -> None:
    refs = pack / "skills" / MEM / "references"
    shutil.rmtree(refs)
    refs.symlink_to(pack.parent / "outside", target_is_directory=True)
    uris, texts = await _served(pack)
    assert f"skill://{MEM}/references/passwd.md" not in uris
    assert not any("SECRET-OUTSIDE" in t for t in texts)


async def test_one_reference_symlinked_out_is_not_served(pack: Path) -> None:
    ref = pack / "skills" / MEM / "references" / "zz-passwd.md"
    ref.symlink_to(pack.parent / "outside" / "passwd.md")
    uris, texts = await _served(pack)
    assert f"skill://{MEM}/references/zz-passwd.md" not in uris
    assert not any("SECRET-OUTSIDE" in t for t in texts)
    assert any(u.startswith(f"skill://{MEM}/references/") for u in uris)  # the rest still are


async def test_a_file_swapped_for_a_symlink_after_start_is_refused_on_read(pack: Path) -> None:
    refs = sorted((pack / "skills" / MEM / "references").glob("*.md"))
    server = build_server(pack)
    victim = refs[0]
    victim.unlink()
    victim.symlink_to(pack.parent / "outside" / "passwd.md")
    async with Client(server) as c:
        with pytest.raises(Exception) as info:
            await c.read_resource(f"skill://{MEM}/references/{victim.name}")
    assert "SECRET-OUTSIDE" not in str(info.value)


def test_skill_files_symlinked_out_are_refused(pack: Path) -> None:
    skill_md = pack / "skills" / MEM / "SKILL.md"
    text = skill_md.read_text()
    (pack.parent / "outside" / "SKILL.md").write_text(text)
    skill_md.unlink()
    skill_md.symlink_to(pack.parent / "outside" / "SKILL.md")
    with pytest.raises(PackError, match="not a file inside the pack"):
        _ = get_skill(pack, MEM).text
    card = pack / "skills" / MEM / "card.yaml"
    card.unlink()
    card.symlink_to("/etc/passwd")
    with pytest.raises(PackError, match="not a file inside the pack"):
        _ = get_skill(pack, MEM).card


def test_a_symlink_that_stays_inside_the_pack_still_reads(pack: Path) -> None:
    refs = sorted((pack / "skills" / MEM / "references").glob("*.md"))
    link = refs[0].parent / "zz-alias.md"
    link.symlink_to(refs[0].name)
    skill = get_skill(pack, MEM)
    assert link in skill.references()
    assert read_pack_text(link, skill.root) == refs[0].read_text()
    with pytest.raises(PackError):
        read_pack_text(pack.parent / "outside" / "passwd.md", pack)
