#!/usr/bin/env bash
# Fails, listing them, if any Go file of the module's packages is not gofmt'ed.
# `go list` gives exactly the directories Go builds (no testdata, no vendor).
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
# The gofmt of the toolchain that builds, not whichever is first on PATH.
gofmt="$("$GO" env GOROOT)/bin/gofmt"
mapfile -t files < <("$GO" list -e -f '{{.Dir}}' ./... | while read -r d; do
	compgen -G "$d/*.go" || true
done)
[ "${#files[@]}" -gt 0 ] || { echo "gofmt: no Go files"; exit 0; }
unformatted=$("$gofmt" -l "${files[@]}")
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need \`gofmt -w\`:" >&2
	echo "$unformatted" | sed "s|^$PWD/|  |" >&2
	exit 1
fi
echo "gofmt: ${#files[@]} files formatted"
