"""Engram Sync: end-to-end encrypted, multi-device sync for Engram memory vaults.

One namespace for the three parts, so nothing generic lands at the top of
site-packages (issue 19; docs/packaging.md):

- ``engram_sync.client``: the device side, its public API (``from engram_sync.client
  import Vault``) and the ``engram-sync`` CLI; installed by ``pip install engram-sync``.
- ``engram_sync.shared_format``: the format both sides share (PROTOCOL.md, VAULT.md).
- ``engram_sync.relay``: the relay; its dependencies come with
  ``pip install 'engram-sync[relay]'``.

In the repository these are the top-level folders ``client/``, ``shared_format/`` and
``relay/``; ``engram_sync/`` holds this file and a symbolic link to each of them.
"""

__version__ = "0.1.0"
