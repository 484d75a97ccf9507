"""Snapshots: the initial snapshot and backfills (positions, COPY text, watermarks, block ranges,
rows to records, signals).
"""
