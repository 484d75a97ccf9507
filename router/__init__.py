"""pgrouter's sans-I/O core.

Everything below this package is pure: bytes and structs in, structs out. It never imports
trio, asyncpg, psycopg2, kafka or pyspark (a test scans the imports to keep it that way), so
every rule here is unit-testable with bytes.
"""

__version__ = "0.1.0"
