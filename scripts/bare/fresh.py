"""A fresh SQLite file for the bare loops: whatever was at PATH (and its WAL
and shared-memory files) removed, then opened in autocommit mode (each loop
writes its own BEGIN and COMMIT) with the given pragmas applied in order.

The loops run on the SQLite that Python was built with, which is not drover's
(drover bundles its own), and the build matters: the bare loop drained 30 %
faster on SQLite 3.51 than on Debian's 3.40, on the same machine. Set
`DROVER_BARE_SQLITE=pysqlite3` (after `pip install pysqlite3-binary`) to run
them on a SQLite of drover's generation instead; each loop names the SQLite it
ran on, on standard error."""

import importlib
import os
import sys

sqlite3 = importlib.import_module(os.environ.get("DROVER_BARE_SQLITE", "sqlite3"))

# drover's own settings on its file (`src/store/sqlite/connect.rs`): page size,
# WAL, synchronous=FULL, cache and mmap sizes.
DROVER_PRAGMAS = ("page_size=8192", "journal_mode=WAL", "synchronous=FULL",
                  "cache_size=-65536", "mmap_size=1073741824")


def fresh(path: str, pragmas=DROVER_PRAGMAS):
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    print(f"sqlite {sqlite3.sqlite_version} ({sqlite3.__name__})", file=sys.stderr)
    c = sqlite3.connect(path, isolation_level=None)
    for pragma in pragmas:
        c.execute("PRAGMA " + pragma)
    return c
