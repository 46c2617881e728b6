"""Encrypted lists: ``Key``, the ``encryption`` object's rules (``spec``) and the AEAD work (``cipher``).

``spec`` needs only the standard library (the format's validator calls it);
``cipher`` and passphrase keys need the ``cryptography`` package (the
``crypto`` extra), imported on first use.
"""
from tensorlist.crypto.keys import Key, as_key

__all__ = ["Key", "as_key"]
