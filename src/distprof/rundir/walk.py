"""The one directory walker: every folder under a root, local or on an fsspec store, with a named symlink policy.

Every walk distprof makes goes through :func:`walk`: the trace listing (``trace.listing.find_traces``), the
run-directory view ``distprof check`` reads (``analysis.runview``), a node's finished files (``store.list_files``,
what ``collect`` copies) and the temporaries still being written (``integrations.ray.collect``). It yields one
:class:`Folder` per folder, top-down and depth first, entries sorted by name; what each caller does with an entry
(report it, list it, skip it) stays the caller's.

Symbolic links (``links``), the one place their policy is decided:

- ``"report"`` (reading a folder that may come from another job): a link is followed while its target stays inside
  the root, so a folder reached twice (a link back up, a link to a sibling) is walked once, where it is met first;
  a link leaving the root is an entry of kind ``"outside"``, never followed nor looked through; a link that cannot
  be followed (dangling, a loop, no permission) is of kind ``"broken"`` with its ``error``.
- ``"skip"`` (listing what this job wrote, to copy it): a link is never followed; it is an entry of kind
  ``"link"``, so that the caller lists only real files and folders and no link brings a file from elsewhere along.

An fsspec store has no links: both policies walk it alike. The walk is bounded: a folder nested deeper than
``max_depth`` below the root is reported to ``on_error`` and not walked (a link loop cannot make it endless: a
folder is walked once).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

__all__ = ["MAX_DEPTH", "Entry", "Folder", "Links", "TooDeep", "walk"]

Links = Literal["report", "skip"]
MAX_DEPTH = 64  # folders below the root: no run directory or trace folder is near this deep


class TooDeep(OSError):
    """A folder nested deeper than the walk's ``max_depth`` (its subfolders are not walked)."""


class Entry(NamedTuple):
    """One name in a folder, as the walk's link policy judged it."""
    name: str
    path: str  # the folder's path joined with the name (on a store: the store's path)
    rel: str  # POSIX path relative to the root
    kind: str  # file | dir | other (a FIFO, a device, a socket) | link (skip) | outside | broken (report)
    st: os.stat_result | None = None  # local file, dir, other: its stat (a followed link's target's)
    link: bool = False  # a symbolic link (followed or not)
    error: OSError | None = None  # broken: why it cannot be followed (or stat'ed)


class Folder(NamedTuple):
    path: str  # the root, or the root joined with ``rel`` (on a store: the store's path)
    rel: str  # POSIX path relative to the root ("" for the root)
    names: list[str]  # every name listed in it, sorted (the skipped ones too)
    entries: list[Entry]  # the names not skipped, sorted by name


def walk(root: str, links: Links, *, fs: Any = None, skip: Callable[[str], bool] | None = None,
         on_error: Callable[[str, str, Exception], None] | None = None,
         max_depth: int = MAX_DEPTH) -> Iterator[Folder]:
    """The folders under ``root`` (included), top-down, depth first, by name; see the module docstring for ``links``.

    ``fs``: an fsspec filesystem ``root`` is a path of (None: local). ``skip(name)``: names neither looked at nor
    walked (they are still in :attr:`Folder.names`). ``on_error(path, rel, error)``: a folder that cannot be listed
    (or is too deep to walk); without it, such a folder is passed over in silence. A local folder is listed whole
    before it is yielded.
    """
    if links not in ("report", "skip"):
        raise ValueError(f"links={links!r}: expected 'report' or 'skip'")
    if fs is not None:
        return _walk_store(fs, root, skip, on_error, max_depth)
    return _walk_local(root, links, skip, on_error, max_depth)


def _walk_local(root: str, links: Links, skip: Callable[[str], bool] | None,
                on_error: Callable[[str, str, Exception], None] | None, max_depth: int) -> Iterator[Folder]:
    real_top = os.path.realpath(root)
    inside = real_top.rstrip("/") + "/"
    try:
        st = os.stat(root)
        seen = {(st.st_dev, st.st_ino)}  # folders met already (a link back up must not loop)
    except OSError:
        seen = set()
    stack = [(root, "", 0)]
    while stack:
        d, rel, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                listed = sorted(it, key=lambda e: e.name)
        except OSError as e:
            if on_error is not None:
                on_error(d, rel, e)
            continue
        entries, subdirs = [], []
        for de in listed:
            if skip is not None and skip(de.name):
                continue
            entry = _local_entry(de, f"{rel}/{de.name}" if rel else de.name, links, real_top, inside)
            entries.append(entry)
            if entry.kind == "dir" and entry.st is not None and (entry.st.st_dev, entry.st.st_ino) not in seen:
                seen.add((entry.st.st_dev, entry.st.st_ino))
                subdirs.append(entry)
        yield Folder(d, rel, [de.name for de in listed], entries)
        if subdirs and depth >= max_depth:
            if on_error is not None:
                on_error(d, rel, TooDeep(f"nested deeper than {max_depth} folders; its folders are not walked"))
            continue
        stack.extend((e.path, e.rel, depth + 1) for e in reversed(subdirs))


def _local_entry(de: os.DirEntry, rel: str, links: Links, real_top: str, inside: str) -> Entry:
    try:
        link = de.is_symlink()
    except OSError:
        link = False
    try:
        if not link:
            st = de.stat(follow_symlinks=False)
        elif links == "skip":
            return Entry(de.name, de.path, rel, "link", link=True)
        else:
            target = os.path.realpath(de.path)
            if target != real_top and not target.startswith(inside):
                return Entry(de.name, de.path, rel, "outside", link=True)
            st = os.stat(de.path)  # inside: follow it (a loop fails here, it does not hang)
    except OSError as e:
        return Entry(de.name, de.path, rel, "broken", link=link, error=e)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return Entry(de.name, de.path, rel, kind, st, link)


def _walk_store(fs: Any, root: str, skip: Callable[[str], bool] | None,
                on_error: Callable[[str, str, Exception], None] | None, max_depth: int) -> Iterator[Folder]:
    stack = [(root, "", 0)]
    while stack:
        d, rel, depth = stack.pop()
        try:
            infos = fs.ls(d, detail=True)
        except Exception as e:  # a storage library's own errors too (botocore's ...): the store's, not ours
            if on_error is not None:
                on_error(d, rel, e)
            continue
        base = d.rstrip("/")
        found: dict[tuple[str, str], Entry] = {}
        for info in infos:
            pathname = info["name"].rstrip("/")
            name = posixpath.basename(pathname)
            if not name or pathname == base:
                continue  # some stores list the folder itself
            kind = "dir" if info.get("type") == "directory" else "file"
            found.setdefault((name, kind), Entry(name, pathname, f"{rel}/{name}" if rel else name, kind))
        listed = [found[k] for k in sorted(found)]
        entries = [e for e in listed if skip is None or not skip(e.name)]
        yield Folder(d, rel, list(dict.fromkeys(e.name for e in listed)), entries)
        subdirs = [e for e in entries if e.kind == "dir"]
        if subdirs and depth >= max_depth:
            if on_error is not None:
                on_error(d, rel, TooDeep(f"nested deeper than {max_depth} folders; its folders are not walked"))
            continue
        stack.extend((e.path, e.rel, depth + 1) for e in reversed(subdirs))
