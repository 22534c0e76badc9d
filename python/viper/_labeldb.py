"""The label database of viper.neardata: one SQLite file (WAL mode) per PipeStore.

Schema (user_version 1, application_id 0x56504C42 "VPLB"):
    labels(id INTEGER PRIMARY KEY, label INTEGER, score REAL, version INTEGER, time REAL)
    meta(key TEXT PRIMARY KEY, value TEXT)       model, shard (the data's path and size),
                                                 seen_version (the version the store labels with now),
                                                 seen_publish_ns (its publish time, which tells a restarted
                                                 numbering's version from the old run's of the same number)
A label of version 0 is one the store found stale when the numbering started again.

Every batch is one transaction (a reader sees all of a batch's rows or none of them), with
synchronous=FULL: a label whose transaction committed survives the store being killed. A file
that is not this database (another SQLite database, a corrupt one, any other file) is refused
with viper.InvalidArgumentError and never written to.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Iterable, Iterator, Optional, Sequence

from ._viper import InvalidArgumentError

APPLICATION_ID = 0x56504C42  # "VPLB"
SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"
_LABEL_COLUMNS = [("id", "INTEGER"), ("label", "INTEGER"), ("score", "REAL"), ("version", "INTEGER"),
                  ("time", "REAL")]
_META_COLUMNS = [("key", "TEXT"), ("value", "TEXT")]


def _refuse(path: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"label database {path}: {why}; refusing to use it (it is left untouched)")


def _columns(conn: sqlite3.Connection, table: str) -> list:
    return [(row[1], row[2].upper()) for row in conn.execute(f"PRAGMA table_info({table})")]


def check_label_db(path, model: Optional[str], shard: Optional[str] = None) -> None:
    """Raises viper.InvalidArgumentError unless `path` is absent, empty, or a label database of
    this schema (and of `model` and `shard`, those named). Reads only."""
    _check_existing(os.fspath(path), {"model": model, "shard": shard})


def _stamp_mismatch(key: str, stored: str, wanted: str) -> str:
    if key == "model":
        return f"it holds labels of model {stored!r}, not {wanted!r}"
    return f"it holds labels of the shard {stored}, not of {wanted} (remove it to label this shard from scratch)"


def _check_existing(path: str, stamps: dict) -> None:
    if os.path.isdir(path):
        raise _refuse(path, "is a directory; give the database's file (created if absent)")
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise InvalidArgumentError(f"label database {path}: its directory {parent} does not exist") from None
        return
    if size == 0:
        return
    with open(path, "rb") as f:
        head = f.read(16)
    if head != _SQLITE_MAGIC:
        raise _refuse(path, f"not an SQLite database (first bytes {head[:16]!r})")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            app = conn.execute("PRAGMA application_id").fetchone()[0]
            if app != APPLICATION_ID:
                raise _refuse(path, f"application_id {app:#x} is not a Viper label database's ({APPLICATION_ID:#x})")
            user = conn.execute("PRAGMA user_version").fetchone()[0]
            if user != SCHEMA_VERSION:
                raise _refuse(path, f"schema version {user}, this Viper reads version {SCHEMA_VERSION}")
            if _columns(conn, "labels") != _LABEL_COLUMNS or _columns(conn, "meta") != _META_COLUMNS:
                raise _refuse(path, "its tables are not labels(id, label, score, version, time) and meta(key, value)")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _refuse(path, f"integrity check failed: {check}")
            for key, wanted in stamps.items():
                stored = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
                if wanted is not None and stored is not None and stored[0] != wanted:
                    raise _refuse(path, _stamp_mismatch(key, stored[0], wanted))
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise _refuse(path, f"corrupt ({e})") from None


class LabelDB:
    """One store's labels. Not thread-safe: one writer thread (the PipeStore's); readers open
    their own LabelDB(path, readonly=True) (WAL: they never block the writer)."""

    def __init__(self, path, *, model: Optional[str] = None, shard: Optional[str] = None, readonly: bool = False):
        """`model` and `shard` (what the store labels: its data's path and size), when given, must
        be those the database was first used with (then they are stamped into it)."""
        self.path = os.fspath(path)
        stamps = {"model": model, "shard": shard}
        _check_existing(self.path, stamps)
        if readonly:
            if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
                raise InvalidArgumentError(f"label database {self.path}: does not exist")
            self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                         check_same_thread=False)
        else:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._create()
        self.readonly = readonly
        for key, wanted in stamps.items():
            stored = self.meta(key)
            if wanted is not None and stored is not None and stored != wanted:
                self._conn.close()
                raise _refuse(self.path, _stamp_mismatch(key, stored, wanted))
            if wanted is not None and stored is None and not readonly:
                self._set_meta(key, wanted)

    def _create(self) -> None:
        c = self._conn
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("BEGIN IMMEDIATE")
        try:
            if c.execute("PRAGMA application_id").fetchone()[0] == 0:  # new (checked above: else ours)
                c.execute(f"PRAGMA application_id={APPLICATION_ID}")
                c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                c.execute("CREATE TABLE labels(id INTEGER PRIMARY KEY, label INTEGER, score REAL, version INTEGER, "
                          "time REAL)")
                c.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
                c.execute("CREATE INDEX labels_version ON labels(version)")
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def meta(self, key: str) -> Optional[str]:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, str(value)))

    @property
    def seen_version(self) -> int:
        """The version the store labels with now: the newest it has seen (0: none)."""
        value = self.meta("seen_version")
        return int(value) if value is not None else 0

    def note_version(self, version: int, publish_ns: int = 0) -> None:
        """Records that the store now labels with `version` (published at `publish_ns` on the
        producer's clock; 0: unknown): labels of every other version are stale from now on. The
        model's numbering can start again (a node that kept no file tier): a lower number than the
        last, or the same number published at another time, is a version of the new run, and the
        labels numbered from it up are the old run's; they are marked stale (version 0, which no
        version has), so that none passes for one of the new run's."""
        seen = self.seen_version
        seen_ns = int(self.meta("seen_publish_ns") or 0)
        restarted = version < seen or (version == seen and 0 not in (publish_ns, seen_ns) and publish_ns != seen_ns)
        if version == seen and not restarted and publish_ns in (0, seen_ns):
            return
        with self._transaction():
            if restarted:
                self._conn.execute("UPDATE labels SET version=0 WHERE version>=?", (int(version),))
            self._set_meta("seen_version", int(version))
            self._set_meta("seen_publish_ns", int(publish_ns))

    def write_batch(self, ids: Sequence[int], labels: Sequence[int], scores: Sequence[float], version: int) -> None:
        """One transaction: every row of the batch or none."""
        if not len(ids) == len(labels) == len(scores):
            raise ValueError(f"label database: {len(ids)} ids, {len(labels)} labels and {len(scores)} scores: "
                             "one label and one score per id")
        now = time.time()
        rows = [(int(i), int(l), float(s), int(version), now) for i, l, s in zip(ids, labels, scores)]
        with self._transaction():
            self._conn.executemany("INSERT OR REPLACE INTO labels(id, label, score, version, time) VALUES(?,?,?,?,?)",
                                   rows)

    def _transaction(self):
        conn = self._conn

        class _Tx:
            def __enter__(self):
                conn.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *rest):
                conn.execute("ROLLBACK" if exc_type else "COMMIT")
                return False
        return _Tx()

    def ids_not_at(self, version: int, ids: Iterable[int]) -> list:
        """Those of `ids` with no label of `version` yet (in the order given)."""
        done = {row[0] for row in self._conn.execute("SELECT id FROM labels WHERE version=?", (int(version),))}
        return [i for i in ids if i not in done]

    def count(self, version: Optional[int] = None) -> int:
        if version is None:
            return self._conn.execute("SELECT COUNT(*) FROM labels").fetchone()[0]
        return self._conn.execute("SELECT COUNT(*) FROM labels WHERE version=?", (int(version),)).fetchone()[0]

    def rows(self, stale: bool = False) -> Iterator[dict]:
        """Every row (stale=True: those of another version than seen_version), by id; one read
        transaction."""
        query = "SELECT id, label, score, version, time FROM labels"
        args: tuple = ()
        if stale:
            query += " WHERE version != ?"
            args = (self.seen_version,)
        for i, label, score, version, t in self._conn.execute(query + " ORDER BY id", args):
            yield {"id": i, "label": label, "score": score, "version": version, "time": t}

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
