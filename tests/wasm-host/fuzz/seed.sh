#!/bin/sh
# Seeds the `exchange` corpus (tests/wasm-host/fuzz/corpus/exchange) from the
# scanner's request bodies (filter/fuzz/seeds/scan, first byte = the scanner's
# knobs, dropped): for every selector byte (plugin configuration index and
# path, see fuzz_targets/exchange.rs), the bodies of the path's format, sent
# without headers (body path) and with `x-session-id` (header path).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
seeds="$here/../../../filter/fuzz/seeds/scan"
out="$here/corpus/exchange"
mkdir -p "$out"
sel=0
while [ "$sel" -lt 64 ]; do
    case $(( (sel >> 4) % 4 )) in
        0) bodies="chat-00 kv-00" ;;
        1) bodies="responses-00" ;;
        2) bodies="messages-00" ;;
        *) bodies="completions-00" ;;
    esac
    for b in $bodies; do
        f="$out/seed-$sel-$b"
        # [selector][header count][chunk count] body
        { printf "\\$(printf %03o "$sel")\\000\\001"; tail -c +2 "$seeds/$b"; } > "$f"
        # The same with x-session-id: [selector][1][1] name NUL value NUL body
        { printf "\\$(printf %03o "$sel")\\001\\001x-session-id\\000run-1\\000"; tail -c +2 "$seeds/$b"; } > "$f-h"
    done
    sel=$((sel + 1))
done
echo "$(ls "$out" | wc -l) inputs in $out"
