#!/bin/bash
# The same run started by torchrun, one command per node (no Slurm): torchrun sets RANK and
# LOCAL_RANK, from which `concord peer` without --id takes its id and its GPU. With the default
# gRPC data plane Concord uses only torchrun's ranks; with TRANSPORT=torch the tensors move over
# a torch.distributed process group (NCCL on GPUs, gloo on CPUs) joined at torchrun's
# MASTER_ADDR/MASTER_PORT (env://) — a fixed world: no rejoin (docs/deployment.md).
#
#   HEAD=node0 NODE_RANK=0 examples/torchrun/run.sh     # on node 0, after Mosquitto and
#   HEAD=node0 NODE_RANK=1 examples/torchrun/run.sh     #   `concord orchestrator` started there
#   TRANSPORT=torch HEAD=node0 NODE_RANK=0 examples/torchrun/run.sh   # NCCL/gloo data plane
#
# run.toml's `peers` must be NNODES × NPROC (default 2 × 4).
set -euo pipefail
: "${HEAD:?the first node's host name}" "${NODE_RANK:?this node's rank, 0 …}"
NNODES=${NNODES:-2}
NPROC=${NPROC:-4}
CONFIG=${CONFIG:-run.toml}
RUN_ID=${RUN_ID:-concord-demo}
TRANSPORT=${TRANSPORT:-grpc}
# the first non-loopback IPv4 address (`hostname -i` answers 127.0.1.1 with Debian's /etc/hosts)
ADDRESS=$(hostname -I | awk '{for (i = 1; i <= NF; i++) if ($i !~ /^127\./ && $i !~ /:/) {print $i; exit}}')
: "${ADDRESS:?no routable IPv4 address on this node (hostname -I)}"
# --insecure: plaintext gRPC and unsigned control inside the cluster's network, said out loud
# (refused otherwise); with [network.tls] in run.toml set SECURITY= (empty) to drop it
SECURITY=${SECURITY---insecure}
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --node-rank "$NODE_RANK" \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD:29400" --rdzv-id "$RUN_ID" --no-python \
    concord peer --config "$CONFIG" --broker "mqtt://$HEAD:1883" --run-id "$RUN_ID" \
    --listen "$ADDRESS:0" --set "network.transport=$TRANSPORT" $SECURITY
