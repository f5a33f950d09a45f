#!/bin/sh
# One node of the compose file's Redis Cluster: AOF on, noeviction, and the
# node announces its service name so clients in the network can reach it.
exec redis-server \
  --cluster-enabled yes \
  --cluster-config-file /data/nodes.conf \
  --cluster-node-timeout 2000 \
  --cluster-announce-hostname "$(hostname)" \
  --cluster-preferred-endpoint-type hostname \
  --appendonly yes \
  --appendfsync always \
  --maxmemory-policy noeviction
