#!/usr/bin/env bash
# docker-compose.postgres.yml (issue 18): runs once, when the primary's data directory is created
# (the postgres image runs /docker-entrypoint-initdb.d/*.sh). A role that may stream WAL to the standby,
# with the same password as the service's role, and the pg_hba line that lets it connect.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v password="$POSTGRES_PASSWORD" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'password';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
