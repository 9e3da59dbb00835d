"""Check an LMDB ``data.mdb`` with plain reads before anything maps it.

LMDB maps the whole file. A file cut short (a bad copy, a full disk, a
truncation by hand) can still name pages past its end, and the first touch of
such a page kills the process with SIGBUS. So before the catalog is opened,
this module reads the file with ``pread`` only and turns any page LMDB would
touch past the end into a :class:`~bucketstore.CatalogError` naming the file
and the offset of the missing page.

Why the trees are walked, and not the meta page's last page number: LMDB's
``mm_last_pg`` counts every page a write transaction allocated, including
pages it allocated and freed again before commit ("loose" pages). Those are
never written, so after a bulk deletion (a tracker cleared, a mark-delete past
hundreds of buckets) a healthy file may end several pages before
``mm_last_pg``; LMDB opens it and reads every key. A length check refuses such
stores; the pages a reader or a writer actually touches are the ones the trees
reference, so those are what must lie within the file:

* the meta page LMDB uses: the one with the higher transaction id;
* from it, the main database and the free-list database (a write transaction
  reads the free list to reuse pages: the pages it *lists* may lie past the end,
  as they are only ever written, but the tree holding the list is read);
* every named database, found as an ``F_SUBDATA`` record in a leaf of the
  main database (and a DUPSORT sub-database in a leaf of a named one);
* the overflow pages of every ``F_BIGDATA`` value, from the page count in the
  first overflow page's header.

Extending a short file before mapping would hide a real truncation (zeros read
as an empty page) and writes to a file that may only be inspected; opening
without mapping is not something LMDB offers. The walk costs one ``pread``
per referenced page: 2 to 3 ms for a catalog of 4,000 bucket keys and
summaries (``tests/engine/catalog/test_lmdb_file.py`` measures it).

The input may be hostile: every page number is range-checked before it is
read, every page is read at most once (a cycle ends there), the tree depth is
bounded by LMDB's own cursor stack depth (32), every node, key, inline value
and sub-page must lie inside its page, so the work is bounded by the file's
page count. A page that is not what its reference says (a branch or leaf page
whose header is a meta or overflow page, a page numbered differently from its
position) is refused too: LMDB would either refuse it or follow garbage.

On-disk layout (LMDB 0.9, ``MDB_DATA_VERSION`` 1, 64-bit, little-endian).
Every page starts with a 16-byte header::

    0    u64  page number
    8    u16  pad (LEAF2 key size in a DUPFIXED sub-page), u16 flags
    12   u16  lower, u16 upper          (overflow: u32 number of pages)
    16   u16[(lower - 16) / 2]  offsets of the nodes in the page

Page flags: BRANCH 0x01, LEAF 0x02, OVERFLOW 0x04, META 0x08, LEAF2 0x20
(fixed-size keys packed after the header, no nodes). A node is::

    0    u16  lo, u16 hi                (leaf: data size lo | hi << 16)
    4    u16  flags                     (branch: child page = lo | hi << 16 | flags << 32)
    6    u16  key size, then the key, then the data

Leaf node flags: BIGDATA 0x01 (the data is the u64 number of its first
overflow page), SUBDATA 0x02 (the data is a 48-byte database record),
DUPDATA 0x04 (without SUBDATA: the data is an inline sub-page). A database
record (``MDB_db``): u32 pad (LEAF2 key size), u16 flags, u16 depth, u64
branch, leaf and overflow page counts, u64 entries, u64 root page
(``2**64 - 1`` when empty). The meta page, at offset 0 and at ``page_size``::

    16   u32  magic 0xBEEFC0DE
    20   u32  data version (1)
    24   u64  fixed map address, u64 map size
    40   48   free-list database record; its first u32 holds the page size
    88   48   main database record
    136  u64  last page number in use
    144  u64  transaction id
"""

from __future__ import annotations

import os
import struct

from ...errors import CatalogError

__all__ = ["check_data_file", "META_MAGIC"]

META_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_P_INVALID = (1 << 64) - 1
_MAX_DEPTH = 32  # LMDB's CURSOR_STACK: a deeper tree cannot be read by LMDB either
_HEADER = 16
_META = struct.Struct("<QHHHHIIQQI")  # pgno, pad, flags, lower, upper, magic, version, address, mapsize, psize
_TAIL = struct.Struct("<QQ")  # last page number, transaction id
_TAIL_AT = 136
_META_BYTES = _TAIL_AT + _TAIL.size  # 152
_FREE_DB_AT, _MAIN_DB_AT = 40, 88
_PAGE = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_PAGES = struct.Struct("<I")  # an overflow page's page count, at offset 12
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow pages, entries, root
_PGNO = struct.Struct("<Q")
#: Walks tried while the file keeps changing under the walk. A read-only open beside a live
#: writer reads pages this walk does not pin (it is no registered LMDB reader): two commits
#: later the writer may reuse them, and the walk may see a page of another snapshot.
_ATTEMPTS = 10


def check_data_file(path: str) -> int:
    """Validate an existing, non-empty ``data.mdb``: every page LMDB would touch lies within it.

    :returns: the file size in bytes.
    :raises CatalogError: the file cannot be read, is not an LMDB data file, or
        one of the pages its trees reference lies past its end or is not the
        page the reference expects (``offset`` names that page).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}", path=path) from None
    try:
        for attempt in range(_ATTEMPTS):
            size, page_size, txnid, roots = _read_metas(fd, path)
            try:
                _Walk(fd, path, size, page_size).trees(roots)
                return size
            except CatalogError:
                # A writer may have committed (and reused pages) while we walked: a
                # changed transaction id means the walk saw a mix, so look again.
                if attempt + 1 == _ATTEMPTS or _read_metas(fd, path)[2] == txnid:
                    raise
        raise AssertionError("unreachable")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}", path=path) from None
    finally:
        os.close(fd)


def _read_metas(fd: int, path: str) -> tuple[int, int, int, list[tuple[int, int, str]]]:
    """Size, page size, and the newer meta's transaction id and two database records."""
    size = os.fstat(fd).st_size
    first = os.pread(fd, _META_BYTES, 0)
    if len(first) < _META_BYTES:
        raise CatalogError(f"{path}: catalog file of {size} bytes is too short to hold an LMDB meta page",
                           path=path, offset=0)
    page_size = _META.unpack_from(first)[-1]
    if page_size < 512 or page_size > 1 << 16 or page_size & (page_size - 1):
        raise CatalogError(f"{path}: offset 40: not an LMDB data file (page size {page_size})", path=path,
                           offset=40)
    if size < 2 * page_size:
        raise CatalogError(f"{path}: catalog file of {size} bytes is truncated: its two meta pages "
                           f"need {2 * page_size}", path=path, offset=size)
    metas = []
    for number in (0, 1):
        at = number * page_size
        raw = first if number == 0 else os.pread(fd, _META_BYTES, at)
        pgno, _, flags, _, _, magic, version, _, _, psize = _META.unpack_from(raw)
        if magic != META_MAGIC or version != _DATA_VERSION or not flags & _P_META or pgno != number \
                or psize != page_size:
            raise CatalogError(f"{path}: offset {at}: meta page {number} is not a valid LMDB meta page",
                               path=path, offset=at)
        metas.append((_TAIL.unpack_from(raw, _TAIL_AT)[1], raw))
    # LMDB reads through the meta with the higher transaction id (meta 0 on a tie).
    txnid, raw = metas[1] if metas[1][0] > metas[0][0] else metas[0]
    roots = []
    for at, what in ((_FREE_DB_AT, "free-list database"), (_MAIN_DB_AT, "main database")):
        pad, *_, root = _DB.unpack_from(raw, at)
        roots.append((root, pad, f"the root of the {what}"))
    return size, page_size, txnid, roots


class _Walk:
    """One pass over the trees of one meta page: every referenced page read at most once."""

    def __init__(self, fd: int, path: str, size: int, page_size: int) -> None:
        self.fd, self.path, self.size, self.page_size = fd, path, size, page_size
        self.pages = size // page_size  # a partial last page is as missing as an absent one
        self.seen: set[int] = set()

    def fail(self, pgno: int, why: str) -> CatalogError:
        at = pgno * self.page_size
        return CatalogError(f"{self.path}: offset {at}: page {pgno} {why}", path=self.path, offset=at)

    def past_end(self, pgno: int, ref: str) -> CatalogError:
        return self.fail(pgno, f"({ref}) lies past the end of the catalog file of {self.size} bytes: "
                               "the file is truncated")

    def trees(self, roots: list[tuple[int, int, str]]) -> None:
        # (page, depth, LEAF2 key size of its database, who references it)
        stack = [(root, 1, pad, ref) for root, pad, ref in roots if root != _P_INVALID]
        while stack:
            pgno, depth, key_size, ref = stack.pop()
            if pgno in self.seen:
                continue  # a cycle or a shared page: its references were followed already
            if pgno >= self.pages:
                raise self.past_end(pgno, ref)
            if depth > _MAX_DEPTH:
                raise self.fail(pgno, f"({ref}) is deeper than {_MAX_DEPTH} levels")
            self.seen.add(pgno)
            page = os.pread(self.fd, self.page_size, pgno * self.page_size)
            if len(page) < self.page_size:
                raise self.past_end(pgno, ref)
            number, _, flags, lower, upper = _PAGE.unpack_from(page)
            if number != pgno or not flags & (_P_BRANCH | _P_LEAF) or flags & (_P_OVERFLOW | _P_META):
                raise self.fail(pgno, f"({ref}) is not a B-tree page (header: page {number}, flags {flags:#x})")
            count = self.slots(page, 0, self.page_size, lower, upper, pgno)
            if flags & _P_LEAF2:
                if _HEADER + count * key_size > self.page_size:
                    raise self.fail(pgno, f"holds {count} keys of {key_size} bytes: more than a page")
                continue
            ref = f"referenced from page {pgno}"
            for ptr in struct.unpack_from(f"<{count}H", page, _HEADER):
                lo, hi, node_flags, key_len = self.node(page, 0, self.page_size, lower, ptr, pgno)
                data_at = ptr + _NODE.size + key_len
                if flags & _P_BRANCH:
                    stack.append((lo | hi << 16 | node_flags << 32, depth + 1, key_size, ref))
                    continue
                data_len = lo | hi << 16
                if node_flags & _F_BIGDATA:
                    if data_at + _PGNO.size > self.page_size:
                        raise self.fail(pgno, f"node at {ptr} runs past the page")
                    self.overflow(_PGNO.unpack_from(page, data_at)[0], data_len, ref)
                    continue
                if data_at + data_len > self.page_size:
                    raise self.fail(pgno, f"node at {ptr} runs past the page")
                if node_flags & _F_SUBDATA:
                    if data_len != _DB.size:
                        raise self.fail(pgno, f"node at {ptr} holds a database record of {data_len} bytes")
                    pad, *_, root = _DB.unpack_from(page, data_at)
                    if root != _P_INVALID:
                        stack.append((root, 1, pad, f"a database record in page {pgno}"))
                elif node_flags & _F_DUPDATA:
                    self.sub_page(page, data_at, data_len, pgno)

    def slots(self, page: bytes, start: int, length: int, lower: int, upper: int, pgno: int) -> int:
        """The number of entries of the page (or sub-page) at ``start``, after checking its bounds."""
        if lower < _HEADER or lower > upper or upper > length or (lower - _HEADER) & 1:
            raise self.fail(pgno, f"has impossible bounds (lower {lower}, upper {upper})"
                                  + (f" in its sub-page at {start}" if start else ""))
        return (lower - _HEADER) >> 1

    def node(self, page: bytes, start: int, length: int, lower: int, ptr: int,
             pgno: int) -> tuple[int, int, int, int]:
        """The header of the node at ``ptr`` of the (sub-)page at ``start``; its key must fit."""
        if ptr < lower or ptr + _NODE.size > length:
            raise self.fail(pgno, f"names a node at {start + ptr}, outside its page")
        lo, hi, flags, key_len = fields = _NODE.unpack_from(page, start + ptr)
        if ptr + _NODE.size + key_len > length:
            raise self.fail(pgno, f"node at {start + ptr} has a key running past its page")
        return fields

    def sub_page(self, page: bytes, start: int, length: int, pgno: int) -> None:
        """An inline page of duplicates: LMDB reads it at offsets it holds, so they must stay inside."""
        if length < _HEADER:
            raise self.fail(pgno, f"holds a sub-page of {length} bytes at {start}")
        _, key_size, flags, lower, upper = _PAGE.unpack_from(page, start)
        count = self.slots(page, start, length, lower, upper, pgno)
        if flags & _P_LEAF2:
            if _HEADER + count * key_size > length:
                raise self.fail(pgno, f"sub-page at {start} holds more keys than its size")
            return
        for ptr in struct.unpack_from(f"<{count}H", page, start + _HEADER):
            lo, hi, _, key_len = self.node(page, start, length, lower, ptr, pgno)
            if ptr + _NODE.size + key_len + (lo | hi << 16) > length:
                raise self.fail(pgno, f"node at {start + ptr} has data running past its sub-page")

    def overflow(self, pgno: int, data_len: int, ref: str) -> None:
        """A big value's pages: the first names how many follow, and all must lie within the file."""
        if pgno in self.seen:
            raise self.fail(pgno, f"({ref}) is an overflow page referenced twice")
        if pgno >= self.pages:
            raise self.past_end(pgno, f"overflow page {ref}")
        self.seen.add(pgno)
        head = os.pread(self.fd, _HEADER, pgno * self.page_size)
        if len(head) < _HEADER:
            raise self.past_end(pgno, f"overflow page {ref}")
        number, _, flags, _, _ = _PAGE.unpack_from(head)
        count = _PAGES.unpack_from(head, 12)[0]
        if number != pgno or not flags & _P_OVERFLOW:
            raise self.fail(pgno, f"({ref}) is not an overflow page (header: page {number}, flags {flags:#x})")
        if _HEADER + data_len > count * self.page_size:
            raise self.fail(pgno, f"holds a value of {data_len} bytes in only {count} page(s)")
        if pgno + count > self.pages:
            raise self.past_end(pgno + count - 1, f"the last of {count} overflow pages from page {pgno}")
