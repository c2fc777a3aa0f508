"""The README and the API and admin docs: their links work where they are read, and what they claim holds.

README.md is also the package's long description, shown on the package index, where links
relative to the repository lead nowhere: its links are absolute (or anchors in the README).
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REPOSITORY = "https://github.com/django-scheduler-app/django-scheduler-app"
OWN_DOCS = [ROOT / "docs" / "rest_api.md", ROOT / "docs" / "admin.md"]
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INDENTED = re.compile(r"(?:^\n)(?:^(?: {4}|\t).*\n)+", re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK_PATTERNS = [
    re.compile(r"!?\[[^\]]*\]\((?P<url>[^)\s]+)(?:\s+\"[^\"]*\")?\)"),  # [text](url), ![alt](url)
    re.compile(r"^\s*\[[^\]]+\]:\s*(?P<url>\S+)", re.MULTILINE),  # [label]: url
    re.compile(r"<(?P<url>[a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE),  # <https://...>
    re.compile(r"(?:href|src)=\"(?P<url>[^\"]+)\""),  # HTML
    re.compile(r"(?<![(<\"])\b(?P<url>https?://[^\s<>()\"]*[^\s<>()\".,:;])"),  # bare, linked by GitHub
]
# Not a link that leads into the repository: the web pages that the tour and the test project serve.
LOCAL_SERVER = "http://127.0.0.1:8000/"


def prose(text: str) -> str:
    """``text`` without its code blocks and code spans, where brackets and URLs are not links."""
    return CODE_SPAN.sub("", INDENTED.sub("\n", FENCED.sub("", text)))


def links(document: Path) -> list[str]:
    text = prose(document.read_text())
    return [match["url"] for pattern in LINK_PATTERNS for match in pattern.finditer(text)]


def anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``document``."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCED.sub("", document.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_readme_has_links_to_check():
    assert len(links(README)) >= 15


def test_every_readme_link_is_absolute_or_an_anchor_in_the_readme():
    for url in links(README):
        if url.startswith("#"):
            assert url[1:] in anchors(README), url
        else:
            parts = urlsplit(url)
            assert parts.scheme in ("https", "http") and parts.netloc, f"{url} is relative"


def test_every_readme_link_into_the_repository_names_a_file_that_exists():
    into = [url for url in links(README) if url.startswith(REPOSITORY)]
    assert any("/blob/main/docs/" in url for url in into)
    for url in into:
        address, _, fragment = url.partition("#")
        if address.rstrip("/") == REPOSITORY:
            continue
        match = re.fullmatch(re.escape(REPOSITORY) + r"/(?P<kind>blob|tree)/main/(?P<path>[^?]+)", address)
        assert match, f"{url}: not a blob/main or tree/main link"
        target = ROOT / match["path"]
        assert target.is_file() if match["kind"] == "blob" else target.is_dir(), url
        if fragment:
            assert target.suffix == ".md" and fragment in anchors(target), url


def test_every_readme_link_elsewhere_is_the_repository_or_the_local_server():
    for url in links(README):
        assert url.startswith(("#", REPOSITORY, LOCAL_SERVER)), url


@pytest.mark.parametrize("document", OWN_DOCS, ids=lambda path: path.name)
def test_the_api_and_admin_docs_link_to_files_and_headings_that_exist(document):
    for url in links(document):
        if urlsplit(url).scheme:
            continue
        address, _, fragment = url.partition("#")
        target = (document.parent / address).resolve() if address else document
        assert target.exists(), f"{document.name}: {url}"
        if fragment:
            assert fragment in anchors(target), f"{document.name}: {url}"


# -- what the docs claim ------------------------------------------------------------------


@pytest.mark.django_db
def test_the_readme_and_the_admin_docs_say_where_the_dashboard_is(client):
    path = reverse("admin:app_list", kwargs={"app_label": "scheduler_app"})
    assert path == "/admin/scheduler_app/"
    for document in (README, ROOT / "docs" / "admin.md"):
        assert f"`{path}`" in document.read_text(), document.name
    client.force_login(User.objects.create_superuser("admin"))
    response = client.get(path)
    assert response.status_code == 200 and 'id="scheduler-unknown"' in response.content.decode()


def install_table() -> dict[str, set[str]]:
    """The README's extras and the packages it says each installs."""
    [*_, section] = README.read_text().partition("## Install\n")
    section = section.split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(?P<extra>[\w-]+)` \| (?P<packages>[^|]+) \|", section, re.MULTILINE)
    return {extra: set(re.findall(r"`([\w.-]+)`", packages)) for extra, packages in rows}


def setup_cfg_extras() -> dict[str, set[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    return {
        extra: {Requirement(line).name for line in value.splitlines() if line.strip()}
        for extra, value in extras.items()
    }


@pytest.mark.parametrize("extra", sorted(install_table().keys() | setup_cfg_extras().keys()))
def test_the_install_section_names_each_extra_with_what_it_installs(extra):
    assert install_table().get(extra) == setup_cfg_extras().get(extra)


def test_the_install_section_starts_with_the_package_name():
    [*_, section] = README.read_text().partition("## Install\n")
    assert "pip install django-scheduler-app\n" in section
