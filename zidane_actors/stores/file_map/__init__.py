"""The file-map store (one session as a few text files) and its directory adapter."""

from ._directory import DirectoryFileMapAdapter, open_directory_adapter
from ._names import FileMapStoreOptions
from ._store import FileMapAdapter, FileMapStore, create_file_map_store

__all__ = [
    "DirectoryFileMapAdapter",
    "FileMapAdapter",
    "FileMapStore",
    "FileMapStoreOptions",
    "create_file_map_store",
    "open_directory_adapter",
]
