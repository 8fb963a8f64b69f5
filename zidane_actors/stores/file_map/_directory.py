"""The directory adapter of the file-map store: the map as files in one directory.

:class:`DirectoryFileMapAdapter` commits each save all-or-nothing with a
manifest renamed last; appends write only the appended bytes. One store at a
time has a directory open (a lock file); lines other writers append are read
and kept, and a torn last line a crash left is recovered (see docs/file-map.md).
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import os
import re
import secrets
import stat
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress

import attrs
import msgspec
import trio

from ...errors import (
    ConflictError,
    CorruptDataError,
    CorruptDataWarning,
    ExternalChangeWarning,
    InvalidNameError,
    StoreLockedError,
    StoreReadOnlyError,
    ValidationError,
)
from ...model import parse_json, preview
from ._names import FileMapStoreOptions, check_file_name

__all__ = ["DirectoryFileMapAdapter", "open_directory_adapter"]


_MANIFEST = ".zidane-filemap.json"
"""The commit record of a directory: which files, how many bytes of each, pending renames."""

_LOCK = ".zidane-filemap.lock"
"""The writer lock of a directory: ``flock``-ed while a store has it open.

It holds the holder's pid and, while an append is in flight, where it started
(``{"pid": 7, "generation": 3, "appending": {"turns.jsonl": 88231}}``): bytes
a crash left past that point are the crashed append's, not another writer's.
"""

_TEMP = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp\Z")
"""The adapter's temporary files, ``.<name>.<12 hex>.tmp`` (stale ones are removed on open)."""

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _writable(path: str) -> bool:
    """Whether this process (its effective ids) may create files in the directory ``path``."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK | os.X_OK, effective_ids=effective)


class _Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``.zidane-filemap.json``: one committed save of the map.

    ``files`` gives each file's committed length in bytes (bytes past it are
    an append that never committed); ``pending`` the temporary file to rename
    over a name and ``removed`` the names to unlink, both replayed until done.
    """

    generation: int
    commit: str
    files: dict[str, int]
    pending: dict[str, str] = msgspec.field(default_factory=dict)
    removed: tuple[str, ...] = ()


_Signature = tuple[int, int, int, int]
"""A file's device, inode, size and modification time: changes when anything writes it."""


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@attrs.frozen
class _Snapshot:
    """The committed map as last read or written (``manifest`` ``None``: no manifest yet).

    ``signatures`` tell whether the files are still the ones read or written.
    """

    manifest: bytes | None
    generation: int
    files: dict[str, str]
    sizes: dict[str, int]
    signatures: dict[str, _Signature]


class _LockRecord(msgspec.Struct, frozen=True):
    """The lock file's content: its holder, and the append it has in flight."""

    pid: int = 0
    generation: int = 0
    appending: dict[str, int] = msgspec.field(default_factory=dict)


def _complete_last_line(data: bytes) -> bool:
    """Whether the last line of ``data`` is one whole JSON value (not cut mid-value)."""
    try:
        parse_json(data[data.rfind(b"\n") + 1 :])  # lone surrogate escapes included
    except msgspec.DecodeError:
        return False
    return True


def _text(data: bytes, path: str) -> str:
    """UTF-8 text; a character cut at the very end (a torn write) becomes U+FFFD."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        if exc.end == len(data) and exc.reason == "unexpected end of data":
            return data[: exc.start].decode() + "\ufffd"
        line = data.count(b"\n", 0, exc.start) + 1
        raise CorruptDataError(
            f"{path} line {line} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"file {preview(name)} is not encodable as UTF-8: {exc.reason}"
        ) from None


def _not_regular(path: str, mode: int) -> CorruptDataError:
    kind = (
        "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "a named pipe"
        if stat.S_ISFIFO(mode)
        else "not a regular file"
    )
    return CorruptDataError(
        f"{path} is {kind}; the file-map store reads and writes regular files only and never "
        "follows links (remove it)"
    )


class DirectoryFileMapAdapter:
    """A :class:`FileMapAdapter` keeping each file of the map in one directory.

    A save is all-or-nothing across the files: new content goes to temporary
    files (or is appended past the committed end of a file it extends), then a
    small manifest renamed last commits it; a crash leaves the previous save
    or the new one, and the next open finishes or discards what was in flight.
    Only the map's own files are read or written: links and non-regular files
    are refused, foreign files are left alone. Blocking I/O runs in a worker
    thread, one call at a time, under an ``flock`` of the directory.

    One adapter at a time has a directory open: the first call takes its writer
    lock (``.zidane-filemap.lock``, ``flock``-ed) and :meth:`aclose` releases
    it; another adapter on the directory, in this process or another, gets
    :class:`StoreLockedError`. Lines another writer (zidane itself) appended to
    the turns log are read and kept, and a file another writer rewrote is read
    as it is now (with an :class:`ExternalChangeWarning`); only a loss of
    committed turn bytes is a :class:`CorruptDataError`.

    ``names`` are the map's file names in a directory written before the
    manifest existed (default: the store's default names).
    """

    def __init__(self, path: str | os.PathLike[str], *, names: Iterable[str] | None = None) -> None:
        self._path = os.fspath(path)
        if isinstance(names, str):
            raise ValidationError(f"names must be file names, not a string {preview(names)}")
        defaults = FileMapStoreOptions()
        self._names = tuple(
            check_file_name(n, "file name")
            for n in (
                names
                if names is not None
                else (defaults.meta_file, defaults.turns_file, defaults.send_requests_file)
            )
        )
        self._limiter = trio.CapacityLimiter(1)
        self._snapshot: _Snapshot | None = None
        # Append-only logs (the store's turns file): another writer only adds lines to them.
        self._logs = {defaults.turns_file}
        self._lock_fd: int | None = None
        self._lock_size = 0
        # The last attempt to take the lock found the directory read-only for this user.
        self._read_only = False
        # An append whose commit did not happen (a crash, a failed write): its bytes past the
        # committed end are dropped, never read as another writer's lines.
        self._in_flight: _LockRecord | None = None
        # Lengths of the logs this adapter answered since its last commit: a save built on one
        # of them goes on top of the lines another writer appended since.
        self._served: dict[str, set[int]] = {}
        self._notes: builtins.list[tuple[type[Warning], str]] = []

    @property
    def path(self) -> str:
        """The directory."""
        return self._path

    # -- file primitives (all relative to the directory's descriptor) ----------------------

    def _where(self, name: str) -> str:
        return os.path.join(self._path, name)

    def _open(self, dir_fd: int, name: str, flags: int) -> int | None:
        """A descriptor on the regular file ``name`` (``None`` when absent); never a link."""
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EMLINK):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                raise _not_regular(self._where(name), st.st_mode) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise _not_regular(self._where(name), mode)
        return fd

    def _read(self, dir_fd: int, name: str) -> tuple[bytes, _Signature] | None:
        """The file's bytes, ``None`` when absent."""
        fd = self._open(dir_fd, name, _READ)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            chunks = []
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 24))
                if not chunk:
                    raise CorruptDataError(f"{self._where(name)} shrank while it was read")
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks), _signature(st)
        finally:
            os.close(fd)

    def _create(self, dir_fd: int, name: str, data: bytes) -> _Signature:
        """Write a new file, mode 0600, durably (``O_EXCL``: never an existing path)."""
        fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            return _signature(os.fstat(fd))
        finally:
            os.close(fd)

    def _append(self, dir_fd: int, name: str, end: int, data: bytes) -> _Signature:
        """Write ``data`` at ``end``, where ``name`` ended when it was read for this save."""
        fd = self._open(dir_fd, name, _WRITE)
        if fd is None:
            raise CorruptDataError(f"{self._where(name)} is missing (deleted outside the store)")
        try:
            length = os.fstat(fd).st_size
            if length < end:
                raise CorruptDataError(
                    f"{self._where(name)} holds {length} bytes, fewer than the {end} "
                    "its last save committed (changed outside the store)"
                )
            if length > end:  # never written over: another writer's lines
                raise ConflictError(
                    f"{self._where(name)} grew while this save was written (another writer "
                    "appended to it); nothing of the save was committed: retry it"
                )
            view, offset = memoryview(data), end
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
            os.fsync(fd)
            return _signature(os.fstat(fd))
        finally:
            os.close(fd)

    def _only_link(self, dir_fd: int, name: str) -> bool:
        """Whether ``name`` is a regular file no other path links to (safe to append to)."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_nlink == 1

    def _check_replaceable(self, dir_fd: int, name: str) -> None:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(self._where(name), st.st_mode)

    def _cut(self, dir_fd: int, name: str, length: int) -> _Signature:
        """Truncate ``name`` to ``length`` bytes, durably."""
        fd = self._open(dir_fd, name, _WRITE)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "removed", self._where(name))
        try:
            os.ftruncate(fd, length)
            os.fsync(fd)
            return _signature(os.fstat(fd))
        finally:
            os.close(fd)

    # -- the writer lock -------------------------------------------------------------------

    def _hold(self, dir_fd: int) -> None:
        """Take the directory's writer lock for this adapter (kept until :meth:`aclose`)."""
        if self._lock_fd is not None:
            return
        self._read_only = False
        for _ in range(16):
            try:
                try:
                    fd: int | None = os.open(_LOCK, _LOCK_NEW, 0o600, dir_fd=dir_fd)
                    created = True
                except FileExistsError:
                    fd, created = self._open(dir_fd, _LOCK, _LOCK_OPEN), False
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                if exc.errno != errno.EROFS and _writable(self._path):
                    # Another user's lock file (mode 0600): this user could write the
                    # directory but cannot take its lock. Going on would let two writers in.
                    raise StoreLockedError(
                        f"{self._where(_LOCK)} cannot be opened by this user (uid {os.geteuid()}):"
                        " another user's store holds or held the directory, and this one cannot"
                        " take its lock; nothing was read or written (use a directory of your own)"
                    ) from None
                self._read_only = True  # a directory this user may not write: read without lock
                return
            if fd is None:
                continue  # removed by a store closing just now: create it again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = self._lock_record(fd).pid
                os.close(fd)
                holder = f" (process {pid})" if pid else ""
                raise StoreLockedError(
                    f"{self._path} is open by another file-map store{holder}; one store at a "
                    "time may have a directory open: close the other one, or give each process "
                    "its own directory"
                ) from None
            try:
                here = os.stat(_LOCK, dir_fd=dir_fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                here = None
            if here != os.fstat(fd).st_ino:  # unlinked by its last holder before we locked it
                os.close(fd)
                continue
            record = _LockRecord() if created else self._lock_record(fd)
            self._lock_fd, self._lock_size = fd, 0 if created else os.fstat(fd).st_size
            if record.appending:
                self._in_flight = record  # its holder stopped mid-append: see _committed
            self._mark(msgspec.structs.replace(record, pid=os.getpid()))
            if created:
                os.fsync(dir_fd)
            return
        raise StoreLockedError(f"{self._where(_LOCK)} keeps being replaced; cannot lock it")

    def _refuse_read_only(self) -> None:
        """Refuse a write when the lock is not held: the directory is read-only for this user."""
        if self._lock_fd is None and self._read_only:
            raise StoreReadOnlyError(
                f"{self._path} is read-only for this user (uid {os.geteuid()}): the store reads"
                " it without the writer lock and writes nothing"
            )

    def _lock_record(self, fd: int) -> _LockRecord:
        try:
            return msgspec.json.decode(os.pread(fd, 1 << 16, 0).strip() or b"{}", type=_LockRecord)
        except msgspec.DecodeError:
            return _LockRecord()  # not ours to judge: nothing is known to be in flight

    def _mark(self, record: _LockRecord) -> None:
        """Write ``record`` to the held lock file (padded over what it held before)."""
        assert self._lock_fd is not None
        data = msgspec.json.encode(record).ljust(self._lock_size)
        view, offset = memoryview(data), 0
        while view:
            written = os.pwrite(self._lock_fd, view, offset)
            view, offset = view[written:], offset + written
        self._lock_size = max(self._lock_size, len(data))

    def _release(self) -> None:
        """Give the directory up: remove the lock file unless it records an append to drop."""
        fd, self._lock_fd = self._lock_fd, None
        self._snapshot = None
        self._served.clear()
        if fd is None:
            return
        try:
            if self._in_flight is None:
                with suppress(OSError):
                    dir_fd = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    try:
                        st = os.stat(_LOCK, dir_fd=dir_fd, follow_symlinks=False)
                        if st.st_ino == os.fstat(fd).st_ino:
                            os.unlink(_LOCK, dir_fd=dir_fd)
                    finally:
                        os.close(dir_fd)
        finally:
            os.close(fd)  # releases the lock

    # -- the save protocol -----------------------------------------------------------------

    @contextmanager
    def _directory(self, *, create: bool) -> Iterator[int | None]:
        """The directory's descriptor, locked (``None`` when it is absent and not created)."""
        if create:
            os.makedirs(self._path, mode=0o700, exist_ok=True)
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        try:
            self._hold(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        except BaseException:
            self._snapshot = None  # whatever happened, read the directory afresh next time
            raise
        finally:
            os.close(fd)  # releases the lock

    def _manifest(self, raw: bytes) -> _Manifest:
        where = self._where(_MANIFEST)
        try:
            manifest = msgspec.json.decode(raw, type=_Manifest)
            for name, size in manifest.files.items():
                check_file_name(name, "file name")
                if size < 0:
                    raise ValueError(f"negative size for {preview(name)}")
            for name, temp in manifest.pending.items():
                match = _TEMP.match(temp)
                if name not in manifest.files or not match or match["name"] != name:
                    raise ValueError(f"bad pending rename {preview(temp)} -> {preview(name)}")
            for name in manifest.removed:
                check_file_name(name, "file name")
        except (msgspec.DecodeError, ValueError) as exc:
            raise CorruptDataError(f"{where} does not decode: {exc}") from None
        return manifest

    def _apply(self, dir_fd: int, manifest: _Manifest) -> None:
        """Finish a committed save: rename its temporary files, unlink removed names."""
        for name, temp in manifest.pending.items():
            with suppress(FileNotFoundError):  # renamed already
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        for name in manifest.removed:
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)

    def _clean(self, dir_fd: int) -> None:
        """Remove the adapter's stale temporary files (crashed saves); nothing else."""
        for entry in os.listdir(dir_fd):
            match = _TEMP.match(entry)
            if match is None:
                continue
            try:
                check_file_name(match["name"], "file name")
                os.unlink(entry, dir_fd=dir_fd)
            except (InvalidNameError, OSError):
                pass  # not ours (a directory), or a read-only directory: still readable

    def _unchanged(self, dir_fd: int, cached: _Snapshot) -> bool:
        for name, signature in cached.signatures.items():
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if _signature(st) != signature:
                return False
        return True

    def _current(self, dir_fd: int) -> _Snapshot:
        """The committed map: cached while nothing changed on disk, else recovered and read."""
        manifest_file = self._read(dir_fd, _MANIFEST)
        raw = None if manifest_file is None else manifest_file[0]
        cached = self._snapshot
        if cached is not None and raw == cached.manifest and self._unchanged(dir_fd, cached):
            return cached
        self._snapshot = None
        files, sizes, signatures = {}, {}, {}
        if raw is None:
            self._in_flight = None  # appends need a manifest: nothing of ours can be in flight
            self._clean(dir_fd)
            for name in self._names:
                found = self._read(dir_fd, name)
                if found is not None:
                    data, signatures[name] = found
                    files[name], sizes[name] = _text(data, self._where(name)), len(data)
            return _Snapshot(None, 0, files, sizes, signatures)
        manifest = self._manifest(raw)
        self._apply(dir_fd, manifest)
        self._clean(dir_fd)
        in_flight = self._in_flight
        if in_flight is not None and in_flight.generation != manifest.generation:
            in_flight = None  # that append committed: what lies past a committed end is not its
        dropped = True
        for name, size in manifest.files.items():
            found = self._read(dir_fd, name)
            if found is None:
                raise CorruptDataError(
                    f"{self._where(name)} is missing (deleted outside the store); "
                    f"{self._where(_MANIFEST)} lists it"
                )
            ours = None if in_flight is None else in_flight.appending.get(name)
            data, signatures[name], done = self._committed(dir_fd, name, size, *found, ours)
            dropped = dropped and done
            files[name], sizes[name] = _text(data, self._where(name)), len(data)
        if dropped and self._in_flight is not None:
            self._in_flight = None
            if self._lock_fd is not None:
                self._mark(_LockRecord(pid=os.getpid()))
        self._snapshot = _Snapshot(raw, manifest.generation, files, sizes, signatures)
        return self._snapshot

    def _committed(
        self,
        dir_fd: int,
        name: str,
        size: int,
        data: bytes,
        signature: _Signature,
        ours: int | None,
    ) -> tuple[bytes, _Signature, bool]:
        """``name``'s bytes judged against the ``size`` its manifest committed.

        Bytes of a log past ``ours``, where an append of ours that never
        committed started, are cut (the flag says whether the cut is done).
        Past that, a log longer than committed holds another writer's appended
        lines (read); one that lost only its final newline is read; one that
        lost more raises ``CorruptDataError``. Any other file of another length
        was rewritten by another writer: read as it is now.
        """
        where, done = self._where(name), True
        if ours is not None and size <= ours < len(data) and name in self._logs:
            self._note(
                CorruptDataWarning,
                f"{where}: the {len(data) - ours} bytes an append wrote before it was cut "
                "short by a crash were dropped",
            )
            data = data[:ours]
            try:
                signature = self._cut(dir_fd, name, ours)
            except OSError:
                done = False  # read-only: cut by a later writer
        length = len(data)
        if length == size:
            return data, signature, done
        if name not in self._logs:
            self._note(
                ExternalChangeWarning,
                f"{where} was rewritten outside the store ({size} bytes committed, {length} "
                "now); read as it is now",
            )
            return data, signature, True
        if length > size:
            if size and data[size - 1] != ord("\n"):
                self._note(
                    ExternalChangeWarning,
                    f"{where} changed outside the store ({size} bytes committed, {length} now, "
                    "not whole lines appended); read as it is now",
                )
            return data, signature, done  # another writer appended lines: ours too now
        if length == size - 1 and not data.endswith(b"\n") and _complete_last_line(data):
            self._note(
                ExternalChangeWarning,
                f"{where} lost its final newline outside the store; read as it is (the next "
                "append writes it back)",
            )
            return data, signature, True
        raise CorruptDataError(
            f"{where} holds {length} bytes, fewer than the {size} its last save committed "
            "(committed turns were cut outside the store)"
        )

    def _note(self, category: type[Warning], message: str) -> None:
        self._notes.append((category, message))

    def _warn(self) -> None:
        """Issue the warnings the last calls noted (from the trio thread)."""
        notes, self._notes = self._notes, []
        for category, message in notes:
            warnings.warn(category(message), stacklevel=3)

    def _commit(self, dir_fd: int, old: _Snapshot, files: dict[str, str]) -> None:
        """Save ``files`` over ``old``: stage, rename the manifest (the commit), apply."""
        sizes, pending, signatures = {}, {}, {}
        appends = {}
        for name, text in files.items():
            before = old.files.get(name)
            if before is not None and name in self._logs and not text.startswith(before):
                text = files[name] = self._rebased(name, text, before)
            if before is not None and text == before:
                sizes[name], signatures[name] = old.sizes[name], old.signatures[name]
            elif (
                before is not None
                and old.manifest is not None
                and text.startswith(before)
                and self._only_link(dir_fd, name)
            ):
                appends[name] = _utf8(text[len(before) :], name)
            else:
                self._check_replaceable(dir_fd, name)
                data = _utf8(text, name)
                pending[name] = f".{name}.{secrets.token_hex(6)}.tmp"
                signatures[name] = self._create(dir_fd, pending[name], data)
                sizes[name] = len(data)
        if appends:
            # Where the appends start, durably before their bytes: what a crash leaves past it
            # is theirs to drop, not another writer's lines to keep.
            self._in_flight = _LockRecord(
                pid=os.getpid(),
                generation=old.generation,
                appending={name: old.sizes[name] for name in appends},
            )
            if self._lock_fd is not None:
                self._mark(self._in_flight)
                os.fdatasync(self._lock_fd)
            for name, tail in appends.items():
                try:
                    signatures[name] = self._append(dir_fd, name, old.sizes[name], tail)
                except ConflictError:  # nothing written to it: what lies past its end is not ours
                    left = {n: at for n, at in self._in_flight.appending.items() if n != name}
                    self._in_flight = msgspec.structs.replace(self._in_flight, appending=left)
                    if self._lock_fd is not None:
                        self._mark(self._in_flight)
                    raise
                sizes[name] = old.sizes[name] + len(tail)
        removed = tuple(sorted(set(old.files) - set(files)))
        if old.manifest is not None and sizes == old.sizes and not pending and not removed:
            return  # nothing changed
        manifest = _Manifest(
            generation=old.generation + 1,
            commit=secrets.token_hex(8),
            files=sizes,
            pending=pending,
            removed=removed,
        )
        raw = msgspec.json.encode(manifest)
        staged = f"{_MANIFEST}.{secrets.token_hex(6)}.tmp"
        self._create(dir_fd, staged, raw)
        os.fsync(dir_fd)  # the staged files exist on disk before the manifest names them
        os.replace(staged, _MANIFEST, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        self._in_flight = None
        self._served.clear()
        os.fsync(dir_fd)  # committed
        self._apply(dir_fd, manifest)
        self._snapshot = _Snapshot(raw, manifest.generation, dict(files), sizes, signatures)

    def _rebased(self, name: str, text: str, current: str) -> str:
        """``text`` put after the lines another writer appended to the log ``name``.

        When ``text`` extends a version of the log this adapter answered since
        its last commit, and ``current`` extends that version by whole lines, the
        added part of ``text`` goes after ``current``; otherwise ``text`` as is.
        """
        for length in sorted(self._served.get(name, ()), reverse=True):
            if (
                length < len(current)
                and length < len(text)
                and (length == 0 or current[length - 1] == "\n")
                and text[:length] == current[:length]
            ):
                return current + text[length:]
        return text

    def _get(self) -> dict[str, str]:
        with self._directory(create=False) as dir_fd:
            if dir_fd is None:
                return {}
            files = self._current(dir_fd).files
            for name in self._logs & files.keys():
                served = self._served.setdefault(name, set())
                if len(served) >= 64:
                    served.clear()
                served.add(len(files[name]))
            return dict(files)

    def _save(self, files: dict[str, str]) -> None:
        for name in files:
            check_file_name(name, "file name")
        with self._directory(create=True) as dir_fd:
            assert dir_fd is not None
            self._refuse_read_only()
            self._commit(dir_fd, self._current(dir_fd), files)

    def _delete(self) -> None:
        with self._directory(create=False) as dir_fd:
            if dir_fd is None:
                return
            self._refuse_read_only()
            old = self._current(dir_fd)
            if old.manifest is None and not old.files:
                return
            self._commit(dir_fd, old, {})
            os.unlink(_MANIFEST, dir_fd=dir_fd)
            os.fsync(dir_fd)
            self._snapshot = None

    async def get(self) -> dict[str, str]:
        """The map's files (an absent directory is an empty map)."""
        try:
            return await trio.to_thread.run_sync(self._get, limiter=self._limiter)
        finally:
            self._warn()

    async def save(self, files: dict[str, str]) -> None:
        """Replace the map with ``files``, all-or-nothing and durably."""
        try:
            await trio.to_thread.run_sync(self._save, dict(files), limiter=self._limiter)
        finally:
            self._warn()

    async def delete(self) -> None:
        """Remove the map's files (foreign files in the directory stay)."""
        try:
            await trio.to_thread.run_sync(self._delete, limiter=self._limiter)
        finally:
            self._warn()

    async def open(self) -> None:
        """Take the directory's lock now (creating the directory), not at the first call.

        Raises :class:`StoreLockedError` when another store has it open.
        """
        await trio.to_thread.run_sync(self._open_locked, limiter=self._limiter)

    def _open_locked(self) -> None:
        with self._directory(create=True):
            pass

    async def aclose(self) -> None:
        """Release the directory (its lock); a later call takes it again. Idempotent."""
        with trio.CancelScope(shield=True):  # a cancelled closer still lets the directory go
            await trio.to_thread.run_sync(self._release, limiter=self._limiter)


@asynccontextmanager
async def open_directory_adapter(
    path: str | os.PathLike[str], *, names: Iterable[str] | None = None
) -> AsyncIterator[DirectoryFileMapAdapter]:
    """A :class:`DirectoryFileMapAdapter` on ``path``, created (mode 0700) if missing,
    holding the directory's lock until the block exits (:class:`StoreLockedError` when
    another store has it open)."""
    adapter = DirectoryFileMapAdapter(path, names=names)
    await adapter.open()
    try:
        yield adapter
    finally:
        await adapter.aclose()
