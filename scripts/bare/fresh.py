"""A fresh SQLite file for the bare loops: whatever was at PATH (and its WAL
and shared-memory files) removed, then opened in autocommit mode (each loop
writes its own BEGIN and COMMIT) with the given pragmas applied in order."""

import os
import sqlite3

# drover's own settings on its file (`src/store/sqlite/connect.rs`): page size,
# WAL, synchronous=FULL, cache and mmap sizes.
DROVER_PRAGMAS = ("page_size=8192", "journal_mode=WAL", "synchronous=FULL",
                  "cache_size=-65536", "mmap_size=1073741824")


def fresh(path: str, pragmas=DROVER_PRAGMAS) -> sqlite3.Connection:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    c = sqlite3.connect(path, isolation_level=None)
    for pragma in pragmas:
        c.execute("PRAGMA " + pragma)
    return c
