"""Connections: URLs, masking of secrets, Redis Cluster and Sentinel
plumbing, opening a client and checking the server."""
