"""The controller: ``decide`` (pure decisions), ``daemon`` (asyncio wiring), ``http`` (the API)."""
