"""The anchors of a PEP 503 simple page: each ``<a>`` with its attributes and its text.

One reader for every simple page the factory reads: its own index (``index verify``), a host's
index (``doctor``) and the sdist pages a wheelhouse fetches from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from html.parser import HTMLParser


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anchor:
    attrs: Mapping[str, str | None]  # href, data-requires-python, data-yanked, ...
    text: str  # the link text, stripped: the filename on a PEP 503 page

    @property
    def href(self) -> str:
        return self.attrs.get("href") or ""


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[dict[str, str | None], list[str]]] = []
        self._text: list[str] | None = None  # the open anchor's text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._text = []
            self.found.append((dict(attrs), self._text))

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._text = None


def parse_anchors(page: bytes | str) -> list[Anchor]:
    """Every anchor of an HTML page, in page order; bytes are read as UTF-8 (bad bytes replaced).
    An anchor left open counts, with the text up to the end of the page."""
    parser = _AnchorParser()
    parser.feed(page.decode("utf-8", "replace") if isinstance(page, bytes) else page)
    parser.close()
    return [Anchor(attrs=attrs, text="".join(text).strip()) for attrs, text in parser.found]
