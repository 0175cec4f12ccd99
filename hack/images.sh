#!/usr/bin/env bash
# make images: builds images/<binary>/Dockerfile for each binary with the first image builder
# found (docker with a reachable daemon, podman, buildah), tagged $REGISTRY/<binary>:$VERSION;
# where none is, the same images as OCI archives in bin/images (hack/images, no daemon).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
REGISTRY=${REGISTRY:-dynamig}

builder=()
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
	builder=(docker build)
elif command -v podman >/dev/null; then
	builder=(podman build)
elif command -v buildah >/dev/null; then
	builder=(buildah bud)
fi
if [ ${#builder[@]} -eq 0 ]; then
	# No daemon here: the same images as OCI archives, built by package images (hack/images).
	echo "make images: no image builder (docker with a running daemon, podman, buildah): building OCI archives in bin/images without one." >&2
	exec go run ./hack/images -out bin/images -version "$VERSION" -commit "$COMMIT" -registry "$REGISTRY"
fi
# The Kubernetes matrix (k8s/versions.txt): one scheduler image per supported minor, tagged
# <version>-k8s<minor>; the device plugin and webhook once, on the newest supported minor.
modfile() { if [ "$1" = "$base" ]; then echo go.mod; else echo "k8s/$1/go.mod"; fi; }
minors=$(awk '!/^#/ && NF && $3 == "supported" {print $1}' k8s/versions.txt)
base=$(echo "$minors" | head -1)
newest=$(echo "$minors" | tail -1)
build() { # dockerfile tag modfile
	echo "make images: ${builder[*]} $2 ($3)"
	"${builder[@]}" -f "$1" --build-arg MODFILE="$3" --build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" -t "$2" .
}
for dockerfile in images/*/Dockerfile; do
	name=$(basename "$(dirname "$dockerfile")")
	if [ "$name" = dynamig-scheduler ]; then
		for m in $minors; do build "$dockerfile" "$REGISTRY/$name:$VERSION-k8s$m" "$(modfile "$m")"; done
	else
		build "$dockerfile" "$REGISTRY/$name:$VERSION" "$(modfile "$newest")"
	fi
done
