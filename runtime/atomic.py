"""Files that are either whole or absent: written beside their final name, flushed, then renamed.

A crash mid-write leaves the old file (or none) and a hidden temporary one, never half a file.
Results JSON, checkpoints and the dataset's offline copies all go through `write_atomic`.
"""
import os
import tempfile


def write_atomic(path, write, binary=False):
    """Call `write(file)` on a temporary file in the folder of `path` (made if missing), then
    rename it to `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from other users
    try:
        with os.fdopen(handle, "wb" if binary else "w") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
