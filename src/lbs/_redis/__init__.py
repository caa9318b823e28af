"""Talking to Redis: the connection and its routing, the batch wire, the Lua scripts' contracts."""
