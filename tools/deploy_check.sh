#!/usr/bin/env bash
# Lints and validates the container and deployment files (no Docker engine
# needed): hadolint for the Dockerfiles, yamllint for every YAML file,
# kubernetes-validate for the Kubernetes manifests, ansible-playbook
# --syntax-check and ansible-lint for the playbook, and JSON syntax for the
# Grafana dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-deploy
if [ ! -f $V/.stamp ] || [ requirements-deploy.txt -nt $V/.stamp ]; then
    python3 -m venv $V
    $V/bin/pip install -q --disable-pip-version-check -r requirements-deploy.txt
    touch $V/.stamp
fi
fail=0
step() { echo "deploy-check: $1"; shift; if "$@"; then :; else echo "deploy-check: FAILED: $*"; fail=1; fi; }
step "hadolint" $V/bin/hadolint --failure-threshold warning docker/Dockerfile docker/Dockerfile.cpu
step "yamllint" $V/bin/yamllint -s docker deploy .yamllint
step "kubernetes-validate" $V/bin/kubernetes-validate --strict deploy/k8s/kiln.yaml deploy/k8s/redis.yaml
step "compose schema" $V/bin/check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yml
step "grafana dashboard JSON" python3 -m json.tool docker/grafana/kiln-dashboard.json /dev/null
export ANSIBLE_LOCAL_TEMP=${TMPDIR:-/tmp}/kiln-ansible ANSIBLE_HOME=${TMPDIR:-/tmp}/kiln-ansible-home
step "ansible syntax" $V/bin/ansible-playbook --syntax-check -i localhost, deploy/ansible/site.yml
step "ansible-lint" $V/bin/ansible-lint --offline -q deploy/ansible/site.yml
if [ $fail -ne 0 ]; then echo "deploy-check: failed"; exit 1; fi
echo "deploy-check: all clean"
