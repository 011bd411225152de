#!/usr/bin/env bash
# tp_traffic — the tp benches' per-collective inter-SIP bytes in the JSON (bench_tp.c):
# all_reduce_sip_bytes is hierarchical_allreduce's closed form for the f32 partial (2 SIPs:
# the leaders exchange it once; 3+ SIPs at this size: the values go round, ws-1 of them), and
# the layers call no all_gather / reduce_scatter. decoder_layer with seq_parallel=1 (Megatron's
# sequence parallelism: two all_gathers of the f16 activations, two reduce_scatters of the f32
# partial sums, no all_reduce) gets the real ring all_gather / reduce_scatter among the SIP
# leaders: each of the ws leaders sends (ws-1)/ws of the T x d matrix per call. Usage:
# tp_traffic.sh KBCL
set -euo pipefail
kbcl=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))[sys.argv[2]]))" "$1" "$2"; }
check() { # json field want
    local got
    got=$(field "$1" "$2")
    if [ "$got" != "$3" ]; then echo "FAIL: $1 $2 = $got, want $3"; exit 1; fi
}
"$kbcl" run --bench tp_mlp --verify-data --json "$tmp/mlp.json" >/dev/null
check "$tmp/mlp.json" all_reduce_sip_bytes $((4 * 64 * 4))          # m x d f32, once
check "$tmp/mlp.json" all_gather_sip_bytes 0
check "$tmp/mlp.json" reduce_scatter_sip_bytes 0
"$kbcl" run --bench tp_attention --verify-data --set system.sips.count=4 \
    --json "$tmp/attn.json" >/dev/null
check "$tmp/attn.json" all_reduce_sip_bytes $((3 * 16 * 64 * 4))   # (ws-1) x seq x d f32
check "$tmp/attn.json" all_gather_sip_bytes 0
check "$tmp/attn.json" reduce_scatter_sip_bytes 0
models=$(dirname "$0")/../configs/models
T=16; d=64 # tiny.yaml's d_model, --param seq=16
for ws in 2 4; do
    "$kbcl" run --bench decoder_layer --model "$models/tiny.yaml" --param seq=$T \
        --param seq_parallel=1 --set system.sips.count=$ws --verify-data \
        --json "$tmp/sp$ws.json" >/dev/null
    check "$tmp/sp$ws.json" all_reduce_sip_bytes 0
    check "$tmp/sp$ws.json" all_gather_sip_bytes $((2 * (ws - 1) * T * d * 2))
    check "$tmp/sp$ws.json" reduce_scatter_sip_bytes $((2 * (ws - 1) * T * d * 4))
done
echo "tp_traffic: OK"
