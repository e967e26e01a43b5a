"""MkDocs hook: the lessons (notebooks/*.ipynb) and figures (figures/*.png) live outside docs/,
where the README links to them; the pages link to them as GitHub does (``../figures/x.png``
from docs/), and this hook adds those files to the site and points such links at them, so
the same Markdown reads on GitHub and builds with ``mkdocs build --strict``."""
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
# folders of the repository the site carries, with the files of each it takes
SHARED = {"figures": "*.png", "notebooks": "*.ipynb"}
LINK = re.compile(r"(\]\()([^)\s#]+)")


@event_priority(100)          # before mkdocs-jupyter, which turns the notebooks into pages
def on_files(files, config):
    for folder, pattern in SHARED.items():
        for path in sorted((ROOT / folder).glob(pattern)):
            # src_dir is the repository root: the file is at the same path in the site
            files.append(File(f"{folder}/{path.name}", src_dir=str(ROOT),
                              dest_dir=config.site_dir,
                              use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)
    return LINK.sub(lambda m: m.group(1) + site_link(m.group(2), here), markdown)


def site_link(target, here):
    """The link a page has on GitHub, as the site holds it: a file in one of SHARED's folders
    is found relative to the repository root, everything else is left as it is."""
    if "://" in target:
        return target
    in_repo = posixpath.normpath(posixpath.join("docs", here, target))
    if in_repo.split("/")[0] not in SHARED:
        return target
    return posixpath.relpath(in_repo, here or ".")
