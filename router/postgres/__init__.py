"""PostgreSQL's own forms, used on every floor: LSNs, built-in type names, array and date texts,
quoted names, connection strings, server features.
"""
