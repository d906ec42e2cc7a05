"""The front door stays true (issue 28): the README's example is the quick start's and runs,
every relative link of the README and docs/ leads to a file, and the sequence diagram is what
docs/draw_first_contact.py draws.  (run-tests.sh builds the docs with warnings as errors
and runs their doctests.)"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_readme_example_is_the_quick_starts_and_runs(tmp_path: Path) -> None:
    (example, *_) = _python_blocks(ROOT / "README.md")
    assert example in _python_blocks(DOCS / "quickstart.md")
    assert len(example.strip().splitlines()) <= 16
    script = tmp_path / "hello.py"
    script.write_text(example)
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    assert res.stdout == "b'HELLO OVER RDMA' SMCR\n", res.stderr


def test_relative_links_lead_to_files() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


def test_the_sequence_diagram_is_current() -> None:
    spec = importlib.util.spec_from_file_location("draw_first_contact",
                                                  DOCS / "draw_first_contact.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (DOCS / "first-contact.svg").read_text() == module.svg(), (
        "python docs/draw_first_contact.py redraws it")
