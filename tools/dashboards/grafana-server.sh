#!/usr/bin/env sh
# Runs a local grafana-server (or `grafana server`) with the infermesh provisioning: the Prometheus
# datasource at $PROMETHEUS_URL (default http://localhost:9090) and the boards of grafana/dashboards.
#   GRAFANA_HOME=/usr/share/grafana tools/dashboards/grafana-server.sh [extra grafana arguments]
# Grafana's own state (its database, logs, plugins) goes to $GRAFANA_DATA (default .infermesh/grafana).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)

: "${PROMETHEUS_URL:=http://localhost:9090}"
: "${GRAFANA_HOME:=/usr/share/grafana}"
: "${GRAFANA_DATA:=$root/.infermesh/grafana}"
GF_PATHS_PROVISIONING="$root/grafana/provisioning"
GF_PATHS_DATA="$GRAFANA_DATA/data"
GF_PATHS_LOGS="$GRAFANA_DATA/logs"
GF_PATHS_PLUGINS="$GRAFANA_DATA/plugins"
export PROMETHEUS_URL GF_PATHS_PROVISIONING GF_PATHS_DATA GF_PATHS_LOGS GF_PATHS_PLUGINS
mkdir -p "$GF_PATHS_DATA" "$GF_PATHS_LOGS" "$GF_PATHS_PLUGINS"

if [ -x "$GRAFANA_HOME/bin/grafana" ]; then
  exec "$GRAFANA_HOME/bin/grafana" server --homepath "$GRAFANA_HOME" "$@"
elif command -v grafana >/dev/null 2>&1; then
  exec grafana server --homepath "$GRAFANA_HOME" "$@"
elif command -v grafana-server >/dev/null 2>&1; then
  exec grafana-server --homepath "$GRAFANA_HOME" "$@"
fi
echo "grafana-server.sh: no Grafana found (looked for $GRAFANA_HOME/bin/grafana, grafana and grafana-server on PATH); set GRAFANA_HOME" >&2
exit 1
