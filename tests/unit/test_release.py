"""The release's paperwork agrees with itself: the version in pyproject.toml is the newest in
CHANGELOG.md and the wheel the README installs; a LICENSE ships; no placeholder URL anywhere the
user reads. (The built wheel itself is checked by .ci/wheel-check: make wheel-check.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return data


def test_the_version_is_the_changelogs_newest_and_the_readmes_wheel() -> None:
    version = str(project()["version"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", version) and version != "0.1.0"
    headings = re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings and headings[0] == version, headings
    assert f"dist/brooq_py-{version}-py3-none-any.whl[web]" in (ROOT / "README.md").read_text(
        encoding="utf-8"
    )


def test_the_metadata_is_complete() -> None:
    meta = project()
    assert meta["license"] == "MIT" and (ROOT / "LICENSE").read_text(encoding="utf-8").startswith(
        "MIT License"
    )
    assert meta["requires-python"] == ">=3.11"
    classifiers = meta["classifiers"]
    assert isinstance(classifiers, list) and "Programming Language :: Python :: 3.11" in classifiers
    extras = meta["optional-dependencies"]
    assert isinstance(extras, dict) and {"web", "django", "otel", "dev"} <= set(extras)
    assert any(d.startswith("build") for d in extras["dev"]) and any(
        d.startswith("twine") for d in extras["dev"]
    )
    for url in dict(meta.get("urls") or {}).values():  # type: ignore[call-overload]
        assert "OWNER" not in url and "example" not in url


def test_no_placeholder_url_where_users_read() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [p.name for p in pages if re.search(r"OWNER/|<repo URL>", p.read_text(encoding="utf-8"))]
    assert not found


def test_the_package_says_its_own_version() -> None:
    """``brooq_py.__version__`` is the version the wheel is built with (it said 0.1.0 in 0.4.0)."""
    import brooq_py

    assert brooq_py.__version__ == project()["version"]
