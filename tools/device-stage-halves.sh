#!/usr/bin/env bash
# Split the vLLM bundle's first part (.devbundle/a, ../shared/device/README.md) into two halves
# that each fit one device call beside this checkout: a call carries at most 64 MiB, the
# checkout included, and .devbundle/a alone is 53 MiB. Usage, from the repository root:
#   bash tools/device-stage-halves.sh [BUNDLE_DIR]        (default .devbundle)
# then, on the device machine, two calls instead of `bash .devbundle/a/stage.sh`:
#   run("bash .devbundle/a1/stage.sh", carry=[".devbundle/a1"])
#   run("bash .devbundle/a2/stage.sh", carry=[".devbundle/a2"])
# The second call joins the halves where stage.sh puts the whole file, and checks its SHA-256.
set -euo pipefail
BUNDLE=${1:-.devbundle}
whole="$BUNDLE/a/C.so.xz"
[ -f "$whole" ] || { echo "no $whole: build the bundle first (../shared/device/build-bundle.sh $BUNDLE)"; exit 1; }
mkdir -p "$BUNDLE/a1" "$BUNDLE/a2"
half=$(( ($(stat -c %s "$whole") + 1) / 2 ))
head -c "$half" "$whole" >"$BUNDLE/a1/C.so.xz.1"
tail -c +$(( half + 1 )) "$whole" >"$BUNDLE/a2/C.so.xz.2"
sum=$(sha256sum "$whole" | cut -d' ' -f1)
cat >"$BUNDLE/a1/stage.sh" <<'EOF'
#!/usr/bin/env bash
# Device call 1 of 3: the first half of vLLM's compiled ops, parked outside the checkout.
set -euo pipefail
D="${HOME}/.minipic-device"
mkdir -p "$D" && cp "$(dirname "$0")/C.so.xz.1" "$D/" && echo "staged half 1: $(du -h "$D/C.so.xz.1" | cut -f1)"
EOF
cat >"$BUNDLE/a2/stage.sh" <<EOF
#!/usr/bin/env bash
# Device call 2 of 3: the second half, joined to the first as the bundle's stage.sh leaves it.
set -euo pipefail
D="\${HOME}/.minipic-device"
[ -f "\$D/C.so.xz.1" ] || { echo "half 1 is not staged on this machine: run .devbundle/a1/stage.sh first"; exit 1; }
cat "\$D/C.so.xz.1" "\$(dirname "\$0")/C.so.xz.2" >"\$D/C.so.xz" && rm "\$D/C.so.xz.1"
echo "$sum  \$D/C.so.xz" | sha256sum --check --quiet || { rm "\$D/C.so.xz"; echo "joined file is corrupt"; exit 1; }
echo "staged \$(du -h "\$D/C.so.xz" | cut -f1)"
EOF
du -sh "$BUNDLE/a1" "$BUNDLE/a2"
