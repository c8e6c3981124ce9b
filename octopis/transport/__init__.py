"""The asyncio/ZeroMQ shell around one routing core (DESIGN §2, §4)."""
