#!/bin/bash
# Hydra's -launcher-exec for tests/harness/cluster.py: mpiexec runs it as it would run ssh,
#   cluster-launcher.sh [-x] HOST COMMAND...
# HOST is a simulated node's address; SIMULATED_NODES ("ADDRESS=NODE@CORES ...", set by the cluster)
# names its network namespace and its cores. COMMAND (Hydra's proxy) runs in that namespace, on
# those cores (taskset), and in a UTS namespace of its own, whose host name is the node's name.
set -euo pipefail
while [[ $1 == -* ]]; do shift; done
host=$1
shift
for pair in ${SIMULATED_NODES:-}; do
    if [[ ${pair%%=*} == "$host" ]]; then
        node=${pair#*=}
        core=${node#*@}
        node=${node%@*}
        exec ip netns exec "$node" unshare --uts taskset -c "$core" bash -c 'hostname "$0" && exec bash -c "$1"' "$node" "$*"
    fi
done
echo "$0: $host is no node of this simulated cluster (SIMULATED_NODES: ${SIMULATED_NODES:-unset})" >&2
exit 1
