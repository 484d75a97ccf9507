"""`pgrouter apply`: source transactions reassembled from Kafka and applied to a target PostgreSQL
as set-based SQL.
"""
