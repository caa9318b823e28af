"""mkdocs hooks (mkdocs.yml ``hooks:``): links from the docs to files of the repository.

The pages in ``docs/`` link to files outside it (a plugin's README, a fixture) with relative
paths, which work where the Markdown is read in the repository. The site does not contain those
files, so each such link is pointed at the file in the repository (``repo_url``); a link to a
file that does not exist is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_links")

# An inline link's target, not a URL or an anchor of the page itself.
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")
_BRANCH = "main"


def on_page_markdown(markdown: str, *, page: Any, config: Any, **kwargs: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    source_dir = Path(page.file.abs_src_path).parent

    def repoint(match: re.Match[str]) -> str:
        target, _, anchor = match.group(1).partition("#")
        path = (source_dir / target).resolve()
        if path.is_relative_to(docs_dir) or not path.is_relative_to(root):
            return match.group(0)  # a page of the site: mkdocs checks it
        if not path.exists():
            log.warning(
                "Doc file '%s' links to '%s', which is not in the repository",
                page.file.src_path,
                target,
            )
            return match.group(0)
        kind = "tree" if path.is_dir() else "blob"
        url = (
            f"{config['repo_url'].rstrip('/')}/{kind}/{_BRANCH}/{path.relative_to(root).as_posix()}"
        )
        return f"]({url}{'#' + anchor if anchor else ''})"

    return _LINK.sub(repoint, markdown)
