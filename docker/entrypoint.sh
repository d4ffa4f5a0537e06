#!/bin/sh
# The container's entrypoint: the rabbitmq image's conventions, mapped onto warren-server.
#
#   RABBITMQ_CONFIG_FILE     the config file (the image sets /etc/rabbitmq/rabbitmq.conf);
#                            conf.d/*.conf next to it are read after it
#   RABBITMQ_DEFAULT_USER    the user, password and vhost created at start;
#   RABBITMQ_DEFAULT_PASS    they win over the config file
#   RABBITMQ_DEFAULT_VHOST
#   WARREN_DATA_DIR          durable state (the image sets /var/lib/rabbitmq, its volume,
#                            as the rabbitmq image); set it empty to take data_dir from
#                            the config file
#   WARREN_OLD_DATA_DIR      where images before 2026-11 kept it (/var/lib/warren): a volume
#                            still mounted there with Warren's data in it is used instead
#
# warren-server reads the RABBITMQ_* variables itself; this script only picks the command.
set -eu

# no command, or options only (`docker run warren --port 5673`): run the broker with them;
# `rabbitmq-server`, as some compose files name it, means the broker too
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    set -- warren-server "$@"
elif [ "$1" = rabbitmq-server ]; then
    shift
    set -- warren-server "$@"
fi

old="${WARREN_OLD_DATA_DIR:-/var/lib/warren}"
if [ "${WARREN_DATA_DIR:-}" = /var/lib/rabbitmq ] && [ -e "$old/definitions.sqlite3" ]; then
    echo "docker-entrypoint: using the data in $old (mount it at /var/lib/rabbitmq instead)" >&2
    WARREN_DATA_DIR="$old"
fi

if [ "$1" = warren-server ] && [ -n "${WARREN_DATA_DIR:-}" ]; then
    shift
    set -- warren-server --data-dir "$WARREN_DATA_DIR" "$@"
fi

# exec: the broker is PID 1 and gets docker stop's SIGTERM itself
exec "$@"
