# Service checks for .ci/run (sourced). Each ensure_* starts its server when it is down.

ensure_postgres() {
  if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
    echo "postgres: up"
    return
  fi
  echo "postgres: down, starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p 5432 -q && { echo "postgres: up"; return; }
    sleep 1
  done
  echo "postgres: did not come up" >&2
  return 1
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
    echo "redis: up"
    return
  fi
  echo "redis: down, starting it"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do
    redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && { echo "redis: up"; return; }
    sleep 0.5
  done
  echo "redis: did not come up" >&2
  return 1
}

# A 3-node Redis Cluster on spare ports in a temporary directory; sets REDIS_CLUSTER_URLS.
REDIS_CLUSTER_URLS=""
REDIS_CLUSTER_DIR=""
start_redis_cluster() {
  REDIS_CLUSTER_URLS=""
  echo "redis cluster: not set up yet"
}

stop_redis_cluster() {
  :
}
