"""Bundle the skill pack (skills/ and card.yaml) into wheels as mbridge_perf/_pack, so an
installed server can serve the skills without a checkout. Editable installs read the checkout."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent


class BuildPyWithPack(build_py):
    def run(self) -> None:
        super().run()
        dest = Path(self.build_lib) / "mbridge_perf" / "_pack"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(ROOT / "skills", dest / "skills",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(ROOT / "card.yaml", dest / "card.yaml")


setup(cmdclass={"build_py": BuildPyWithPack})
