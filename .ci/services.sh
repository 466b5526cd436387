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

# MariaDB (the mysql store's tests): root with an empty password over TCP, database `test`.
ensure_mysql() {
  if mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; then
    echo "mariadb: up"
  else
    echo "mariadb: down, starting it"
    service mariadb start >/dev/null 2>&1 ||
      start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    local up=""
    for _ in $(seq 1 30); do
      mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1 && { up=1; break; }
      sleep 1
    done
    [ -n "$up" ] || { echo "mariadb: did not come up" >&2; return 1; }
    echo "mariadb: up"
  fi
  mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test"
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

# RabbitMQ (the consumer tests): guest/guest on 127.0.0.1:5672. Up means the AMQP port
# answers, not only the node: the tests connect there.
_rabbitmq_port_open() {
  (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null
}

ensure_rabbitmq() {
  if _rabbitmq_port_open; then
    echo "rabbitmq: up"
    return
  fi
  echo "rabbitmq: down, starting it"
  rabbitmq-server -detached
  for _ in $(seq 1 60); do
    _rabbitmq_port_open && { echo "rabbitmq: up"; return; }
    sleep 1
  done
  echo "rabbitmq: did not come up within 60 s" >&2
  return 1
}

# NATS with JetStream (the JetStream consumer tests): 127.0.0.1:4222, its store in
# /var/lib/nats-server. Up means the client port answers.
_nats_port_open() {
  (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null
}

ensure_nats() {
  if _nats_port_open; then
    echo "nats: up"
    return
  fi
  echo "nats: down, starting it (with JetStream)"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  for _ in $(seq 1 30); do
    _nats_port_open && { echo "nats: up"; return; }
    sleep 0.5
  done
  echo "nats: did not come up within 15 s" >&2
  return 1
}

# A 3-node Redis Cluster on spare ports in a temporary directory; sets REDIS_CLUSTER_URLS
# (`redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, what idem's connect() and the
# cluster tests read from IDEM_TEST_REDIS_CLUSTER). Nothing is kept on disk but the nodes'
# cluster config files, removed with the directory by stop_redis_cluster.
REDIS_CLUSTER_URLS=""
REDIS_CLUSTER_DIR=""
REDIS_CLUSTER_PORTS=""

# A port nothing listens on, whose cluster bus port (+10000) is free too.
_redis_spare_port() {
  local port
  for _ in $(seq 1 200); do
    # Node ports 20000-22767, so that each node's cluster bus (port + 10000) stays below
    # the kernel's ephemeral range (32768 and up), where outgoing connections take ports
    # that a listener then fails to bind.
    port=$((20000 + RANDOM % 2768))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
      && ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null \
      && [[ " $REDIS_CLUSTER_PORTS " != *" $port "* ]]; then
      echo "$port"
      return 0
    fi
  done
  echo "redis cluster: no spare port found" >&2
  return 1
}

# Starts the cluster, trying again on fresh ports when a node fails to come up.
start_redis_cluster() {
  local attempt
  for attempt in 1 2 3; do
    if _start_redis_cluster_once; then
      return 0
    fi
    echo "redis cluster: attempt $attempt failed, stopping its nodes" >&2
    stop_redis_cluster
  done
  return 1
}

_start_redis_cluster_once() {
  REDIS_CLUSTER_URLS=""
  REDIS_CLUSTER_PORTS=""
  REDIS_CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-redis-cluster.XXXXXX")
  local port hosts="" urls=""
  for _ in 1 2 3; do
    port=$(_redis_spare_port)
    REDIS_CLUSTER_PORTS="$REDIS_CLUSTER_PORTS $port"
    mkdir -p "$REDIS_CLUSTER_DIR/$port"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --protected-mode no \
      --cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 5000 \
      --save "" --appendonly no --dir "$REDIS_CLUSTER_DIR/$port" \
      --pidfile "$REDIS_CLUSTER_DIR/$port/redis.pid" --logfile "$REDIS_CLUSTER_DIR/$port/redis.log"
    hosts="$hosts 127.0.0.1:$port"
    urls="${urls:+$urls,}127.0.0.1:$port"
  done
  for port in $REDIS_CLUSTER_PORTS; do
    local up=""
    for _ in $(seq 1 50); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then up=1; break; fi
      sleep 0.2
    done
    [[ -n "$up" ]] || { echo "redis cluster: node $port did not come up" >&2; return 1; }
  done
  # shellcheck disable=SC2086 # one argument per node
  redis-cli --cluster create $hosts --cluster-replicas 0 --cluster-yes >"$REDIS_CLUSTER_DIR/create.log" 2>&1 || {
    cat "$REDIS_CLUSTER_DIR/create.log" >&2
    return 1
  }
  for port in $REDIS_CLUSTER_PORTS; do
    local ok=""
    for _ in $(seq 1 150); do
      if redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then ok=1; break; fi
      sleep 0.2
    done
    [[ -n "$ok" ]] || { echo "redis cluster: node $port is not ok after 30s" >&2; return 1; }
  done
  REDIS_CLUSTER_URLS="redis+cluster://$urls"
  echo "redis cluster: up at $REDIS_CLUSTER_URLS"
}

stop_redis_cluster() {
  local port pid
  for port in $REDIS_CLUSTER_PORTS; do
    pid=$(cat "$REDIS_CLUSTER_DIR/$port/redis.pid" 2>/dev/null || true)
    if [[ -n "$pid" ]]; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  if [[ -n "$REDIS_CLUSTER_DIR" && -d "$REDIS_CLUSTER_DIR" ]]; then
    rm -rf "$REDIS_CLUSTER_DIR"
  fi
  REDIS_CLUSTER_PORTS=""
  REDIS_CLUSTER_DIR=""
}
