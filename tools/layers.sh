#!/usr/bin/env bash
# Fails when a source file includes a header from a higher layer.
#
# Layers, lowest first; a file may include headers of its own layer or
# lower ones only:
#   0 common    tensor, status, logging, histograms, file helpers
#   1 config    server and model configuration
#   2 graph     the graph IR
#   3 kernels   backend interface, op table, cpu/, cuda/
#   4 models    ONNX loading, passes, plans, the model API
#   5 cache     result cache
#   6 server    inference core, batcher, transports, metrics
#   7 commands  main and the subcommands, the load generator
# tests/ may include anything and is not checked. Includes that name no file
# of the tree (system and generated headers) are skipped; a quoted include
# is looked up from the root (the build's -I.), then beside the file.
set -euo pipefail
cd "$(dirname "$0")/.."

# Which layer a path is in: the first pattern (a shell glob) that matches it
# wins, so list files before their folder. One line per pattern.
LAYER_MAP='
commands/*          7 commands
server/*            6 server
cache/*             5 cache
models/*            4 models
kernels/*           3 kernels
graph/*             2 graph
config/*            1 config
common/*            0 common
'

# Known violations, allowed until the code that holds them moves: one line
# each, "file header" (shell globs), with why in a comment above it.
EXCEPTIONS='
'

layer_of() { # path -> "rank name", or nothing if outside the layers
    local f=$1 pat rank name
    while read -r pat rank name; do
        [ -n "$pat" ] || continue
        # shellcheck disable=SC2053
        if [[ $f == $pat ]]; then echo "$rank $name"; return; fi
    done <<<"$LAYER_MAP"
}

allowed() { # file header -> 0 if a line of EXCEPTIONS matches both
    local fp hp
    while read -r fp hp; do
        case $fp in '' | '#'*) continue ;; esac
        # shellcheck disable=SC2053
        if [[ $1 == $fp && $2 == $hp ]]; then return 0; fi
    done <<<"$EXCEPTIONS"
    return 1
}

bad=0 checked=0
while IFS= read -r f; do
    fl=$(layer_of "$f")
    [ -n "$fl" ] || continue
    frank=${fl%% *}
    checked=$((checked + 1))
    while IFS= read -r inc; do
        if [ -f "$inc" ]; then h=$inc
        elif [ -f "$(dirname "$f")/$inc" ]; then h=$(realpath -m --relative-to=. "$(dirname "$f")/$inc")
        else continue; fi
        hl=$(layer_of "$h")
        [ -n "$hl" ] || continue
        hrank=${hl%% *}
        if [ "$hrank" -gt "$frank" ] && ! allowed "$f" "$h"; then
            echo "layers: $f (${fl#* }) includes $h (${hl#* }), a higher layer"
            bad=1
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' | grep -v '^tests/')

if [ $bad -ne 0 ]; then
    echo "layers: failed (layer order and exceptions: tools/layers.sh)"
    exit 1
fi
echo "layers: $checked files, no include points up"
