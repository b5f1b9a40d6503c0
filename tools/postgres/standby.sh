#!/usr/bin/env bash
# docker-compose.postgres.yml (issue 18): the streaming hot standby. On first start its data
# directory is a pg_basebackup of the primary (-R writes primary_conninfo and standby.signal), retried
# until the primary answers; then the image's entrypoint starts it as a read-only hot standby.
set -euo pipefail
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    until PGPASSWORD="$POSTGRES_PASSWORD" pg_basebackup -h postgres-primary -U replicator -D "$PGDATA" \
            -R -X stream -c fast; do
        echo "waiting for postgres-primary..." >&2
        rm -rf "${PGDATA:?}"/*
        sleep 2
    done
    chmod 700 "$PGDATA"
fi
exec docker-entrypoint.sh postgres -c hot_standby=on
