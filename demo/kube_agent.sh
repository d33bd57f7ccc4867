#!/bin/sh
# An SRE agent's remediation of "web is misbehaving", in plain kubectl: no Reversi code, no SDK.
# It runs as its own ServiceAccount (KUBECONFIG); the Run it opened records each write at admission,
# and kubectl prints Reversi's warning for each ("recorded as step N ... of Run ...").
set -eu
echo "+ kubectl scale deployment web --replicas=0"
kubectl -n "$NS" scale deployment web --replicas=0
echo "+ kubectl patch configmap settings (mode: maintenance)"
kubectl -n "$NS" patch configmap settings --type merge -p '{"data":{"mode":"maintenance"}}'
echo "+ kubectl delete service web"
kubectl -n "$NS" delete service web
echo "+ kubectl delete pvc data"
kubectl -n "$NS" delete pvc data --wait=false
