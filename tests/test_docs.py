"""The documentation holds together: every relative link and image in README.md, docs/ and examples/ resolves
(the file exists and, for `file.md#anchor`, a heading with that GitHub anchor exists), and the README stays short."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("README.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n[ok](p.md#title) [bad](missing.md) ![img](x.png)\n```\n[in code](ignored.md)\n```\n")
    assert links(page) == ["p.md#title", "missing.md", "x.png"]
    assert anchors(page) == {"title"}
    assert github_anchor("The main job (examples/r1zero.py)") == "the-main-job-examplesr1zeropy"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= 12_000


def test_rlvr_config_options_are_documented_where_declared():
    """Every field RLVRConfig declares is in one group of its docstring's Parameters: section, with its help text,
    and docs/trainer.md shows the table generated from the same texts (`python -m trl_rlvr.scripts.options_doc`)."""
    import dataclasses

    from trl import GRPOConfig

    from trl_rlvr import RLVRConfig
    from trl_rlvr.config import PARAMETER_GROUPS
    from trl_rlvr.scripts.options_doc import main as check_docs

    grouped = [name for names in PARAMETER_GROUPS.values() for name in names]
    own = [f.name for f in dataclasses.fields(RLVRConfig)
           if f.name not in GRPOConfig.__dataclass_fields__ or f.name in RLVRConfig.__dict__.get("__annotations__", {})]
    assert sorted(grouped) == sorted(set(own)) and len(grouped) == len(set(grouped))
    doc = " ".join(RLVRConfig.__doc__.split())
    assert "Parameters:" in RLVRConfig.__doc__
    for name in grouped:
        help_text = " ".join(RLVRConfig.__dataclass_fields__[name].metadata["help"].split())
        assert f"{name} (" in doc and help_text in doc, name
    assert check_docs(["--check"]) == 0, "docs/trainer.md is not current: run python -m trl_rlvr.scripts.options_doc"
