#!/usr/bin/env bash
# Runs a docs/examples program the way its doc shows and compares what it prints with the
# output the doc quotes, so the quoted lines (numbers included) cannot drift from the code.
# The doc's first ```sh block with lines starting `/tmp/NAME` gives the command lines (their
# arguments are kept, /tmp/NAME becomes BINARY); the next plain ``` block is the expected
# output of all of them, in order. Usage: doc_example.sh DOC.md NAME BINARY
set -euo pipefail
doc=$1
name=$2
bin=$(readlink -f "$3")

# CMD <command line> and OUT <expected line>, in order of appearance
parsed=$(awk -v cmd="/tmp/$name" '
    /^```/ {
        if (!open) {
            open = 1; lang = substr($0, 4)
            if (state == 2 && lang == "") state = 3
        } else {
            open = 0
            if (state == 1) state = 2
            else if (state == 3) exit
        }
        next
    }
    open && state <= 1 && lang == "sh" && index($0, cmd) == 1 { print "CMD " $0; state = 1; next }
    open && state == 3 { print "OUT " $0 }
' "$doc")

cmds=$(sed -n 's/^CMD //p' <<<"$parsed")
want=$(sed -n 's/^OUT //p' <<<"$parsed")
if [[ -z $cmds || -z $want ]]; then
    echo "doc_example: $doc has no \`/tmp/$name\` command block followed by an output block" >&2
    exit 1
fi

got=""
while read -r line; do
    args=${line#"/tmp/$name"}
    # word splitting of the documented arguments is intended (plain words only)
    # shellcheck disable=SC2086
    out=$("$bin" $args)
    got+="$out"$'\n'
done <<<"$cmds"
got=${got%$'\n'}

if [[ $got != "$want" ]]; then
    echo "doc_example: $name prints what $doc does not quote" >&2
    diff -u <(printf '%s\n' "$want") <(printf '%s\n' "$got") >&2 || true
    exit 1
fi
printf '%s\n' "$got"
