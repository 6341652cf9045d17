#!/usr/bin/env bash
# Moves every `FROM image:tag@sha256:...` of deploy/*.Dockerfile to the digest that tag names
# in its registry now (the image index, so --platform still picks linux/amd64). Run it where
# Docker Hub and gcr.io answer (this repository's CI has no network), review the diff, commit:
# builds then use exactly those bytes until the next run.
set -euo pipefail
cd "$(dirname "$0")"
command -v docker >/dev/null || { echo "pin-base-images: needs docker (with buildx)" >&2; exit 1; }
for dockerfile in *.Dockerfile; do
  for ref in $(sed -n 's/^FROM \([^ ]*@sha256:[0-9a-f]\{64\}\).*/\1/p' "$dockerfile" | sort -u); do
    tag=${ref%@*}
    digest=$(docker buildx imagetools inspect "$tag" --format '{{json .Manifest}}' \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
    case "$digest" in
      sha256:*) ;;
      *) echo "pin-base-images: no digest for $tag" >&2; exit 1 ;;
    esac
    if [ "$tag@$digest" != "$ref" ]; then
      echo "$dockerfile: $tag -> $digest"
      sed -i "s|$ref|$tag@$digest|" "$dockerfile"
    fi
  done
done
