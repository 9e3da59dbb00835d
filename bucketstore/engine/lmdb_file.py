"""Check an LMDB ``data.mdb`` with plain reads before anything maps it.

LMDB maps the whole file and trusts its two meta pages. A file cut short (a
bad copy, a full disk, a truncation by hand) still has meta pages that point
at pages past its end, and the first touch of such a page kills the process
with SIGBUS. So before the catalog is opened, both meta pages are read with
``pread`` and the file must be at least as long as the highest page they
name. This turns a signal into a :class:`~bucketstore.CatalogError`.

Meta page layout (LMDB 0.9, ``MDB_DATA_VERSION`` 1, 64-bit), at offset 0 and
at offset ``page_size``::

    0    u64  page number            (0 or 1)
    8    u16  pad, u16 flags (P_META = 0x08), u16 lower, u16 upper
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

from ..errors import CatalogError

__all__ = ["check_data_file", "META_MAGIC"]

META_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_P_META = 0x08
_META = struct.Struct("<QHHHHIIQQI")  # pgno, pad, flags, lower, upper, magic, version, address, mapsize, psize
_TAIL = struct.Struct("<QQ")  # last page number, transaction id
_TAIL_AT = 136
_META_BYTES = _TAIL_AT + _TAIL.size  # 152


def check_data_file(path: str) -> int:
    """Validate an existing, non-empty ``data.mdb`` against its own meta pages.

    :returns: the file size in bytes.
    :raises CatalogError: the file cannot be read, is not an LMDB data file, or
        is shorter than the pages its meta pages say are in use.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}", path=path) from None
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, _META_BYTES, 0)
        if len(first) < _META_BYTES:
            raise CatalogError(f"{path}: catalog file of {size} bytes is too short to hold an LMDB meta page",
                               path=path)
        page_size = _META.unpack_from(first)[-1]
        if page_size < 512 or page_size > 1 << 16 or page_size & (page_size - 1):
            raise CatalogError(f"{path}: offset 40: not an LMDB data file (page size {page_size})", path=path)
        if size < 2 * page_size:
            raise CatalogError(f"{path}: catalog file of {size} bytes is truncated: its two meta pages "
                               f"need {2 * page_size}", path=path)
        last_page = 0
        for number in (0, 1):
            at = number * page_size
            raw = first if number == 0 else os.pread(fd, _META_BYTES, at)
            pgno, _, flags, _, _, magic, version, _, _, psize = _META.unpack_from(raw)
            if magic != META_MAGIC or version != _DATA_VERSION or not flags & _P_META or pgno != number \
                    or psize != page_size:
                raise CatalogError(f"{path}: offset {at}: meta page {number} is not a valid LMDB meta page",
                                   path=path)
            last_page = max(last_page, _TAIL.unpack_from(raw, _TAIL_AT)[0])
        # Both metas, not only the newer one: neither may name a page the file lacks.
        needed = (last_page + 1) * page_size
        if size < needed:
            raise CatalogError(f"{path}: catalog file is truncated: {size} bytes, but its meta pages use "
                               f"{last_page + 1} pages of {page_size} bytes ({needed} bytes)", path=path)
        return size
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror or exc}", path=path) from None
    finally:
        os.close(fd)
