"""A vault directory at rest is 0700 and every file in it 0600, whatever the umask it was
made under (issue 13). New vaults are created so (shared_format.vault, client._atomic);
opening one tightens what an older version or another tool left looser."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600


def tighten_modes(vault_dir: Path) -> None:
    """chmod the directory to 0700 and its regular files to 0600 where they are looser
    and this user owns them (others' files are left alone, never followed as links)."""
    uid = os.getuid()
    _tighten(vault_dir, DIR_MODE, uid)
    with os.scandir(vault_dir) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                _tighten(Path(entry.path), FILE_MODE, uid)


def _tighten(path: Path, mode: int, uid: int) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # a temp file renamed away meanwhile
    if info.st_uid != uid or stat.S_ISLNK(info.st_mode):
        return
    if stat.S_IMODE(info.st_mode) & ~mode:
        os.chmod(path, mode)
