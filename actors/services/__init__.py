"""Services every actor group shares: structured logs (``log``), the retry loop (``retry``),
SQL over asyncpg under trio-asyncio (``sql``) and the publication catalog (``catalog``)."""
