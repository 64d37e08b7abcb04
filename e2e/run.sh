#!/usr/bin/env bash
# rlkube end to end on kind: create a cluster, build and load the image, install the chart, run a
# CPU/gloo CartPole RLJob (2 train, 2 eval) to Complete, scale its eval workers mid-run and check
# that training was not restarted, check `kubectl get rlj`, delete it and check that everything it
# owned is garbage-collected, then tear down. On failure it dumps logs and events first.
#
# Needs: docker (a running daemon), kind, kubectl, helm 3 (or .venv/bin/helm from `make test`).
#
#   e2e/run.sh                 the whole run (about 10 minutes on a laptop)
#   e2e/run.sh --dry-run       print every step, run nothing
#   e2e/run.sh --keep-cluster  leave the cluster up afterwards (kind delete cluster --name NAME)
#   e2e/run.sh --reuse-cluster use an existing cluster of that name instead of creating one
#   e2e/run.sh --no-build      do not build the image (it must exist locally)
#
# Settings (environment): RLKUBE_E2E_CLUSTER (rlkube-e2e), RLKUBE_E2E_IMAGE (rlkube:e2e),
# RLKUBE_E2E_NODE_IMAGE (kind's default; e.g. kindest/node:v1.33.1), RLKUBE_E2E_TIMEOUT (30m, for
# Complete), RLKUBE_E2E_GC_TIMEOUT (120, seconds for garbage collection), RLKUBE_E2E_ARTIFACTS
# (runs/e2e: logs and events on failure).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${RLKUBE_E2E_CLUSTER:-rlkube-e2e}"
IMAGE="${RLKUBE_E2E_IMAGE:-rlkube:e2e}"
NODE_IMAGE="${RLKUBE_E2E_NODE_IMAGE:-}"
JOB_TIMEOUT="${RLKUBE_E2E_TIMEOUT:-30m}"
ARTIFACTS="${RLKUBE_E2E_ARTIFACTS:-$ROOT/runs/e2e}"
GC_TIMEOUT="${RLKUBE_E2E_GC_TIMEOUT:-120}"

RELEASE=rlkube
OPERATOR_NS=rlkube-system
OPERATOR_DEPLOYMENT="$RELEASE-operator"
JOB_NS=rlkube-e2e
JOB_FILE="$ROOT/examples/rljob-kind.yaml"
JOB=cartpole-kind
TRAIN_REPLICAS=2
EVAL_SCALED=3
# Names and labels of the job's children (runtime/rlkube/contract.py, rlkube_operator/render.py;
# tests/delivery/test_e2e_script.py checks them against what the operator renders).
TRAIN_STS="$JOB-train"
EVAL_STS="$JOB-eval"
CHILDREN="configmap/$JOB-job service/$JOB-train service/$JOB-coordinator service/$JOB-eval poddisruptionbudget/$JOB-train statefulset/$JOB-train statefulset/$JOB-eval"
# The printer columns of `kubectl get rlj` (crds/rljob.yaml), after NAME.
COLUMNS="PHASE TRAIN EVAL EPOCH PUBLISHED LOADED RETURN AGE"
JOB_SELECTOR="rlkube.io/job-name=$JOB"
TRAIN_SELECTOR="$JOB_SELECTOR,rlkube.io/role=train"

DRY_RUN=0
KEEP_CLUSTER=0
REUSE_CLUSTER=0
BUILD=1
HAVE_CLUSTER=0 # a cluster to dump diagnostics from
OWN_CLUSTER=0  # a cluster this run created, and so deletes

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

while (($#)); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --keep-cluster) KEEP_CLUSTER=1 ;;
    --reuse-cluster) REUSE_CLUSTER=1 ;;
    --no-build) BUILD=0 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "e2e/run.sh: unknown option $1 (see --help)" >&2
      exit 2
      ;;
  esac
  shift
done

HELM="${HELM:-helm}"
if ! command -v "$HELM" >/dev/null 2>&1 && [[ -x "$ROOT/.venv/bin/helm" ]]; then
  HELM="$ROOT/.venv/bin/helm"
fi
KUBECTL="${KUBECTL:-kubectl}"
KIND="${KIND:-kind}"
DOCKER="${DOCKER:-docker}"

step() { printf '\n==> %s\n' "$*"; }

# Commands and checks are printed on the script's stdout (fd 3), also from inside $(...).
exec 3>&1

# Print a command as it can be pasted into a shell.
show() {
  local arg line=""
  local plain='^[-A-Za-z0-9_./:=,@%+]+$'
  for arg in "$@"; do
    if [[ "$arg" =~ $plain ]]; then
      line+=" $arg"
    else
      line+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '+%s\n' "$line" >&3
}

# Print a command, then run it (unless --dry-run).
run() {
  show "$@"
  if ((DRY_RUN)); then
    return 0
  fi
  "$@"
}

# Print a command, then run it and print its output to stdout (for $(...)); nothing under --dry-run.
capture() {
  show "$@"
  if ((DRY_RUN)); then
    return 0
  fi
  "$@"
}

# Print captured output (there is none under --dry-run).
say() {
  if ((!DRY_RUN)); then
    printf '%s\n' "$*"
  fi
}

fail() {
  echo "e2e FAILED: $*" >&2
  exit 1
}

# A check that needs real output; under --dry-run it is only announced.
check() {
  local what="$1"
  shift
  printf 'check: %s\n' "$what"
  if ((DRY_RUN)); then
    return 0
  fi
  "$@" || fail "this does not hold: $what"
}

k() { run "$KUBECTL" --context "kind-$CLUSTER" "$@"; }
kc() { capture "$KUBECTL" --context "kind-$CLUSTER" "$@"; }

train_pods() {
  kc -n "$JOB_NS" get pods -l "$TRAIN_SELECTOR" -o \
    jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {range .status.containerStatuses[*]}{.restartCount}{end}{"\n"}{end}' |
    sort
}

jsonpath() {
  local object="$1" path="$2"
  kc -n "$JOB_NS" get "$object" -o "jsonpath=$path"
}

dump_diagnostics() {
  echo "--- diagnostics (also in $ARTIFACTS) ---" >&2
  mkdir -p "$ARTIFACTS"
  local kubectl=("$KUBECTL" --context "kind-$CLUSTER")
  {
    "${kubectl[@]}" get rlj,statefulsets,pods,services,configmaps -A -o wide
    "${kubectl[@]}" -n "$JOB_NS" describe rlj "$JOB"
    "${kubectl[@]}" -n "$JOB_NS" describe statefulsets,pods -l "$JOB_SELECTOR"
  } >"$ARTIFACTS/objects.txt" 2>&1 || true
  "${kubectl[@]}" get events -A --sort-by=.lastTimestamp >"$ARTIFACTS/events.txt" 2>&1 || true
  "${kubectl[@]}" -n "$OPERATOR_NS" logs "deployment/$OPERATOR_DEPLOYMENT" --all-containers --timestamps \
    >"$ARTIFACTS/operator.log" 2>&1 || true
  local pod
  for pod in $("${kubectl[@]}" -n "$JOB_NS" get pods -l "$JOB_SELECTOR" -o name 2>/dev/null); do
    "${kubectl[@]}" -n "$JOB_NS" logs "$pod" --all-containers --timestamps >"$ARTIFACTS/${pod#pod/}.log" 2>&1 || true
    "${kubectl[@]}" -n "$JOB_NS" logs "$pod" --all-containers --previous >"$ARTIFACTS/${pod#pod/}.previous.log" 2>&1 || true
  done
  tail -n 40 "$ARTIFACTS/objects.txt" "$ARTIFACTS/events.txt" "$ARTIFACTS/operator.log" >&2 || true
}

on_exit() {
  local status=$?
  trap - EXIT
  if ((status != 0 && HAVE_CLUSTER && !DRY_RUN)); then
    dump_diagnostics
  fi
  if ((OWN_CLUSTER && !KEEP_CLUSTER)); then
    step "tear down"
    # shellcheck disable=SC2310 # best effort: a failed teardown must not hide the run's status
    run "$KIND" delete cluster --name "$CLUSTER" || true
  fi
  exit "$status"
}
trap on_exit EXIT

# --- 0. prerequisites ------------------------------------------------------------------------
step "prerequisites: docker (daemon up), kind, kubectl, helm"
installed() { command -v "$1" >/dev/null; }
docker_answers() { "$DOCKER" info >/dev/null 2>&1; }
for tool in "$DOCKER" "$KIND" "$KUBECTL" "$HELM"; do
  check "$tool is installed" installed "$tool"
done
check "the Docker daemon answers" docker_answers
echo "on failure: objects, events, operator and pod logs are written to $ARTIFACTS and tailed here"

# --- 1. cluster -------------------------------------------------------------------------------
if ((REUSE_CLUSTER)); then
  step "reuse kind cluster $CLUSTER"
  run "$KIND" export kubeconfig --name "$CLUSTER"
  HAVE_CLUSTER=1
else
  step "create kind cluster $CLUSTER"
  create=("$KIND" create cluster --name "$CLUSTER" --config "$ROOT/e2e/kind.yaml" --wait 180s)
  if [[ -n "$NODE_IMAGE" ]]; then
    create+=(--image "$NODE_IMAGE")
  fi
  HAVE_CLUSTER=1
  OWN_CLUSTER=1
  run "${create[@]}"
fi

# --- 2. image ---------------------------------------------------------------------------------
if ((BUILD)); then
  step "build the image $IMAGE (CPU torch)"
  run "$DOCKER" build --tag "$IMAGE" "$ROOT"
fi
step "load the image into the cluster's nodes"
run "$KIND" load docker-image "$IMAGE" --name "$CLUSTER"

# --- 3. chart ---------------------------------------------------------------------------------
step "install the chart (operator, CRD, RBAC)"
run "$HELM" --kube-context "kind-$CLUSTER" upgrade --install "$RELEASE" "$ROOT/charts/rlkube" \
  --namespace "$OPERATOR_NS" --create-namespace \
  --set "image.repository=${IMAGE%:*}" --set "image.tag=${IMAGE##*:}" --set image.pullPolicy=IfNotPresent \
  --wait --timeout 5m
k wait --for=condition=Established crd/rljobs.rlkube.io --timeout=60s
k -n "$OPERATOR_NS" rollout status "deployment/$OPERATOR_DEPLOYMENT" --timeout=180s

# --- 4. the job -------------------------------------------------------------------------------
step "apply $JOB ($TRAIN_REPLICAS train ranks over gloo, 2 eval workers)"
if ((DRY_RUN)) || ! "$KUBECTL" --context "kind-$CLUSTER" get namespace "$JOB_NS" >/dev/null 2>&1; then
  k create namespace "$JOB_NS"
fi
k -n "$JOB_NS" delete "rlj/$JOB" --ignore-not-found --wait=true --timeout=120s
k -n "$JOB_NS" apply -f "$JOB_FILE"
k -n "$JOB_NS" wait --for=condition=Running "rlj/$JOB" --timeout=10m
complete="$(jsonpath "rlj/$JOB" '{.status.conditions[?(@.type=="Complete")].status}')"
check "the job is still training (raise spec.train.maxEpochs if it finished this fast)" \
  test "$complete" != "True"

# --- 5. scale eval mid-run; training must not restart -----------------------------------------
step "scale eval workers to $EVAL_SCALED while training runs"
train_before="$(train_pods)"
train_generation_before="$(jsonpath "statefulset/$TRAIN_STS" '{.metadata.generation}')"
say "$train_before"
check "all $TRAIN_REPLICAS train pods exist before scaling" \
  test "$(printf '%s\n' "$train_before" | grep -c .)" -eq "$TRAIN_REPLICAS"
k -n "$JOB_NS" scale "rlj/$JOB" --replicas="$EVAL_SCALED"
k -n "$JOB_NS" wait --for=jsonpath='{.spec.replicas}'="$EVAL_SCALED" "statefulset/$EVAL_STS" --timeout=120s
k -n "$JOB_NS" wait --for=jsonpath='{.status.readyReplicas}'="$EVAL_SCALED" "statefulset/$EVAL_STS" --timeout=10m
train_after="$(train_pods)"
train_generation_after="$(jsonpath "statefulset/$TRAIN_STS" '{.metadata.generation}')"
say "$train_after"
check "train pods kept their UIDs and restart counts" test "$train_before" = "$train_after"
check "the train StatefulSet's spec was not changed" \
  test "$train_generation_before" = "$train_generation_after"
check "the train StatefulSet still has $TRAIN_REPLICAS replicas" \
  test "$(jsonpath "statefulset/$TRAIN_STS" '{.spec.replicas}')" = "$TRAIN_REPLICAS"
check "the RLJob's spec.evaluator.replicas is $EVAL_SCALED" \
  test "$(jsonpath "rlj/$JOB" '{.spec.evaluator.replicas}')" = "$EVAL_SCALED"

# --- 6. kubectl get rlj -----------------------------------------------------------------------
step "kubectl get rlj shows the job's progress columns"
table="$(kc -n "$JOB_NS" get rlj "$JOB")"
say "$table"
header="$(printf '%s\n' "$table" | head -n 1)"
columns="$(printf '%s\n' "$header" | tr -s ' ' | sed -e 's/ *$//')"
check "the columns are NAME $COLUMNS" test "$columns" = "NAME $COLUMNS"

# --- 7. completion ----------------------------------------------------------------------------
step "wait for Complete (at most $JOB_TIMEOUT)"
k -n "$JOB_NS" wait --for=condition=Complete "rlj/$JOB" --timeout="$JOB_TIMEOUT"
k -n "$JOB_NS" get rlj "$JOB" -o wide
check "the job reports a phase" test -n "$(jsonpath "rlj/$JOB" '{.status.phase}')"
check "the job did not fail" \
  test "$(jsonpath "rlj/$JOB" '{.status.conditions[?(@.type=="Failed")].status}')" != "True"

# --- 8. delete and garbage collection ---------------------------------------------------------
step "delete the job; everything it owned must go"
k -n "$JOB_NS" delete "rlj/$JOB" --wait=true --timeout=120s
left=""
printf 'poll (%s s): kubectl get %s and pods -l %s\n' "$GC_TIMEOUT" "$CHILDREN" "$JOB_SELECTOR"
if ((!DRY_RUN)); then
  for _ in $(seq $(((GC_TIMEOUT + 1) / 2))); do
    # shellcheck disable=SC2086 # CHILDREN is a list of names
    left="$("$KUBECTL" --context "kind-$CLUSTER" -n "$JOB_NS" get $CHILDREN --ignore-not-found -o name)"
    left+="$("$KUBECTL" --context "kind-$CLUSTER" -n "$JOB_NS" get pods,statefulsets,services,configmaps \
      -l "$JOB_SELECTOR" -o name)"
    [[ -z "$left" ]] && break
    sleep 2
  done
fi
check "no child of the job is left (left: ${left:-none})" test -z "$left"

# --- 9. uninstall -----------------------------------------------------------------------------
step "uninstall the chart"
run "$HELM" --kube-context "kind-$CLUSTER" uninstall "$RELEASE" --namespace "$OPERATOR_NS" --wait

if ((DRY_RUN)); then
  step "dry run: nothing was run"
else
  step "e2e passed"
fi
