"""The durable write-ahead log: framing, reader, group-commit writer, leases, encryption.

``docs/log-format.md`` is the normative description of the file format. Everything
here is standard library only; encryption imports ``cryptography`` lazily.
"""

from __future__ import annotations

from .encryption import AesGcmEncryptor, encryptor_from_env
from .format import Encryptor, encode_frame, encode_record
from .lease import LeaseInfo, LeaseTable
from .reader import Damage, Decryptor, Record, VerifyReport, scan, verify
from .writer import ExclusiveHandle, WALWriter, WriterIO, WriterStats, open_writer

__all__ = [
    "AesGcmEncryptor",
    "Damage",
    "Decryptor",
    "Encryptor",
    "ExclusiveHandle",
    "LeaseInfo",
    "LeaseTable",
    "Record",
    "VerifyReport",
    "WALWriter",
    "WriterIO",
    "WriterStats",
    "encode_frame",
    "encode_record",
    "encryptor_from_env",
    "open_writer",
    "scan",
    "verify",
]
