"""The engine: the only code that knows the Lua scripts, their KEYS/ARGV
layout and their replies. Everything above it calls typed functions."""
