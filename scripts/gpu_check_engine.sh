# shellcheck shell=bash
# scripts/gpu_check_engine.sh - the "engine" phase of scripts/gpu_check.sh (sourced by it,
# not run on its own): ote_bench over the driver gpu_check.sh chose, in two parts.
#
# 1. Correctness, READ and WRITE, every byte checked (--check: the device buffers are
#    filled and read back through host-to-device / device-to-host copies), blocks of
#    4097 B and 16 MiB, batch 2, ENGINE_CHECK_SECS each, the GPU path asserted from the
#    JSON's "path":
#      tcp     staging  cuda:0->cuda:0, cuda:0->host, host->cuda:0 (gpu_paths=staging)
#      shm     ipc      cuda:0->cuda:0, the target's buffer registered with OTE_PERM_IPC
#                       (ote_bench --remote-ipc) and gpu_paths=ipc,staging on both sides
#      shm     staging  cuda:0->cuda:0, gpu_paths=staging (IPC not allowed)
#      rdma    staging  cuda:0->cuda:0 over verbs/sim (requester and source-side staging)
#      rdma    direct   cuda:0->host over verbs/sim, gpu_paths=direct,staging: GPUDirect
#                       needs the dma-buf of the device range mapped by the NIC; the sim
#                       is a software NIC that reaches an MR's bytes through a CPU mmap of
#                       the dma-buf fd, and the NVIDIA driver's dma-buf exporter refuses
#                       mmap (its mmap op returns -ENOTSUPP, can_mmap is false), so against
#                       a real driver without a NIC the registration keeps no dma-buf MR and
#                       the request is staged: that is reported as SKIP (the bytes are
#                       still checked). Over the fake driver (dma-buf = a memfd) it is
#                       direct and must say so.
#    A failed transfer, a wrong byte or another path than the one asserted is a FAIL.
# 2. Figures (a benchmark: printed, never judged by the exit status), ENGINE_FIG_SECS
#    each, 64 MiB blocks, batch 1, back to back in this one run:
#      TCP WRITE and READ host->host vs cuda:0->cuda:0 staged: ratio vs issue 12's 0.9
#      shm WRITE and READ cuda:0->cuda:0 by CUDA IPC vs cuMemcpyDtoD of 64 MiB in one
#        process (tests/cuda:bw_probe --size 64M, same run): ratio vs issue 12's 0.8; and
#        the IPC figures again with gpu_staging_chunk=64M (a local device buffer is cut in
#        pieces of gpu_staging_chunk over IPC), for information
#      the staging sweep: TCP READ 64 MiB cuda:0->cuda:0 staged for gpu_staging_chunk
#        1M, 2M, 4M, 8M x gpu_staging_depth 2, 4, 8 (docs/gpu.md: "Defaults, reasoned").
#    Every ote_bench run is under a timeout (ENGINE_TIMEOUT s), and the phase under a
#    budget (ENGINE_BUDGET s, --engine-budget): a run that would start past it is not
#    started (a SKIP line naming it), so one hanging path cannot eat a device lease. The
#    phase takes about 40 runs of 1-4 s each.
#
# Uses from gpu_check.sh: note, PASSED, FAILED, SKIPPED, LOGDIR, BENCH (ote_bench),
# BENCH_ENV (its LD_LIBRARY_PATH when the package's libraries are needed), PROBE
# (bw_probe), USE_FAKE, ENGINE_CHECK_SECS, ENGINE_FIG_SECS, ENGINE_BUDGET.

ENGINE_TIMEOUT=45
ENGINE_START=$(date +%s)
# Every run starts from the same environment: these keys only where a run sets them.
ENGINE_ENV_RESET=(-u OTE_GPU_PATHS -u OTE_GPU_STAGING_CHUNK -u OTE_GPU_STAGING_DEPTH
    -u OTE_VERBS_PROVIDER -u OTE_TRANSPORTS)

# eng_run NAME [VAR=VALUE...] -- OTE_BENCH_ARGS...: one ote_bench run (--json, no progress)
# with those variables; stdout in $LOGDIR/engine_NAME.out, stderr in .err. Its status.
eng_run() {
    local name=$1 envs=()
    shift
    if [ $(($(date +%s) - ENGINE_START)) -ge "$ENGINE_BUDGET" ]; then
        note "SKIP: engine $name not run: the phase's budget of ${ENGINE_BUDGET}s is spent"
        SKIPPED=$((SKIPPED + 1))
        : >"$LOGDIR/engine_$name.out"
        echo "not run (budget spent)" >"$LOGDIR/engine_$name.err"
        return 125
    fi
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    env "${ENGINE_ENV_RESET[@]}" "${BENCH_ENV[@]}" "${envs[@]}" timeout -k 5 "$ENGINE_TIMEOUT" "$BENCH" \
        --no-progress --json "$@" >"$LOGDIR/engine_$name.out" 2>"$LOGDIR/engine_$name.err"
}

# json_field FILE KEY: the values of KEY in FILE's JSON lines, one a line (quotes dropped).
json_field() {
    sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1"
}

eng_fail_detail() { # NAME RC
    note "FAIL: engine $1 (exit $2$([ "$2" -eq 124 ] && echo ', timed out'))"
    FAILED=$((FAILED + 1))
    sed 's/^/    | /' "$LOGDIR/engine_$1.out" | head -4
    grep -v '^$' "$LOGDIR/engine_$1.err" | tail -8 | sed 's/^/    | /'
    while IFS= read -r l; do SUMMARY+=("    | $l"); done < <(grep -v '^$' "$LOGDIR/engine_$1.err" | tail -4)
}

# eng_check NAME TRANSPORT OP LOCAL REMOTE WANT_PATH GPU_PATHS [OTE_BENCH_ARGS...]
eng_check() {
    local name=$1 tr=$2 op=$3 lm=$4 rm=$5 want=$6 paths=$7 envs rc n ok got
    shift 7
    envs=("OTE_GPU_PATHS=$paths")
    [ "$tr" = rdma ] && envs+=(OTE_VERBS_PROVIDER=sim)
    eng_run "$name" "${envs[@]}" -- --transport "$tr" --op "$op" --local-mem "$lm" \
        --remote-mem "$rm" --block-size 4097,16M --batch-size 2 \
        --duration "${ENGINE_CHECK_SECS}s" --check "$@"
    rc=$?
    [ "$rc" -eq 125 ] && return 0
    n=$(wc -l <"$LOGDIR/engine_$name.out")
    ok=$(grep -c '"check":"ok"' "$LOGDIR/engine_$name.out")
    got=$(json_field "$LOGDIR/engine_$name.out" path | sort -u | tr '\n' ' ')
    got=${got% }
    local what="$tr $op $lm->$rm"
    if [ "$rc" -ne 0 ] || [ "$n" -ne 2 ] || [ "$ok" -ne 2 ]; then
        eng_fail_detail "$name" "$rc"
        note "    ($what: $ok of 2 results checked ok, gpu_paths=$paths)"
    elif [ "$got" = "$want" ]; then
        note "PASS: engine $name ($what, path $got, 4097 B and 16 MiB, every byte checked)"
        PASSED=$((PASSED + 1))
    elif [ "$want" = direct ] && [ "$got" = staging ] && [ "$USE_FAKE" = 0 ]; then
        note "SKIP: engine $name ($what): GPUDirect over verbs/sim cannot work against a real" \
            "driver without a NIC (the sim maps the dma-buf with mmap; NVIDIA's exporter refuses" \
            "it), so it was staged (bytes checked ok); GPUDirect needs an RDMA NIC"
        SKIPPED=$((SKIPPED + 1))
    else
        note "FAIL: engine $name ($what: bytes ok, but the path was '$got', not $want)"
        FAILED=$((FAILED + 1))
    fi
}

# eng_fig NAME WANT_PATH [VAR=VALUE...] -- OTE_BENCH_ARGS...: one figure; sets FIG to its
# GB/s, or to "" (counted FAILED, with the reason) when the run failed or took another path.
FIG=""
eng_fig() {
    local name=$1 want=$2 rc p
    shift 2
    FIG=""
    eng_run "$name" "$@"
    rc=$?
    [ "$rc" -eq 125 ] && return 0
    p=$(json_field "$LOGDIR/engine_$name.out" path | head -1)
    if [ "$rc" -ne 0 ] || [ -z "$(json_field "$LOGDIR/engine_$name.out" gbps)" ]; then
        eng_fail_detail "$name" "$rc"
    elif [ "$p" != "$want" ]; then
        note "FAIL: engine figure $name took path '$p', not $want"
        FAILED=$((FAILED + 1))
    else
        FIG=$(json_field "$LOGDIR/engine_$name.out" gbps | head -1)
    fi
}

# ratio A B: A/B with two decimals, "-" when either is missing or B is 0.
ratio() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f\n", a / b }'; }
# verdict RATIO TARGET: met / missed (never judged over the fake driver).
verdict() {
    if [ "$USE_FAKE" = 1 ]; then echo "(fake: not judged)"; return; fi
    awk -v r="$1" -v t="$2" 'BEGIN { if (r == "-") print "no figure"; else if (r + 0 >= t + 0) print "met"; else print "MISSED" }'
}
fmt() { [ -n "${1:-}" ] && printf '%.2f' "$1" || printf '%s' -; }

engine_phase() {
    local line
    if [ ! -x "$BENCH" ]; then
        note "FAIL: engine phase: no ote_bench at $BENCH"; FAILED=$((FAILED + 1)); return
    fi
    line=$(env "${BENCH_ENV[@]}" "$BENCH" --help 2>&1 >/dev/null | head -1)
    if ! env "${BENCH_ENV[@]}" "$BENCH" --help >/dev/null 2>&1; then
        note "FAIL: ote_bench does not run on this machine: $line"; FAILED=$((FAILED + 1)); return
    fi
    ENGINE_START=$(date +%s)
    note "engine phase: ote_bench $BENCH; checks ${ENGINE_CHECK_SECS}s each, figures" \
        "${ENGINE_FIG_SECS}s each, at most ${ENGINE_BUDGET}s in all"

    # ---- 1. correctness over the driver, every byte checked ----
    local op
    for op in write read; do
        eng_check "tcp_staged_${op}_dd" tcp "$op" cuda:0 cuda:0 staging staging
        eng_check "tcp_staged_${op}_dh" tcp "$op" cuda:0 host staging staging
        eng_check "tcp_staged_${op}_hd" tcp "$op" host cuda:0 staging staging
        eng_check "shm_ipc_${op}_dd" shm "$op" cuda:0 cuda:0 ipc ipc,staging --remote-ipc
        eng_check "shm_staged_${op}_dd" shm "$op" cuda:0 cuda:0 staging staging
        eng_check "rdma_sim_staged_${op}_dd" rdma "$op" cuda:0 cuda:0 staging staging
        eng_check "rdma_sim_direct_${op}_dh" rdma "$op" cuda:0 host direct direct,staging
    done

    # ---- 2. figures (a benchmark: the exit status never depends on them) ----
    local F=("--block-size" 64M "--batch-size" 1 "--duration" "${ENGINE_FIG_SECS}s")
    local hw hr sw sr iw ir iw64 ir64 probe_out dtod rows=() r
    eng_fig fig_tcp_host_write host OTE_GPU_PATHS=staging -- --transport tcp --op write "${F[@]}"
    hw=$FIG
    eng_fig fig_tcp_staged_write staging OTE_GPU_PATHS=staging -- --transport tcp --op write \
        --local-mem cuda:0 --remote-mem cuda:0 "${F[@]}"
    sw=$FIG
    eng_fig fig_tcp_host_read host OTE_GPU_PATHS=staging -- --transport tcp --op read "${F[@]}"
    hr=$FIG
    eng_fig fig_tcp_staged_read staging OTE_GPU_PATHS=staging -- --transport tcp --op read \
        --local-mem cuda:0 --remote-mem cuda:0 "${F[@]}"
    sr=$FIG
    # cuMemcpyDtoD of 64 MiB within one process: the probe's "direct" DtoD figure
    probe_out=$LOGDIR/engine_probe_64M.json
    timeout -k 5 120 "$PROBE" --size 64M --iters 50 --json >"$probe_out" 2>"$LOGDIR/engine_probe_64M.err"
    dtod=$(sed -n 's/.*"copy":"DtoD".*"direct_gbps":\([0-9.]*\).*/\1/p' "$probe_out" | head -1)
    if [ -z "$dtod" ]; then
        note "FAIL: bw_probe --size 64M gave no DtoD figure"; FAILED=$((FAILED + 1))
        sed 's/^/    | /' "$LOGDIR/engine_probe_64M.err" | tail -5
    fi
    local IPC=("OTE_GPU_PATHS=ipc,staging" -- --transport shm --local-mem cuda:0 --remote-mem cuda:0 --remote-ipc)
    eng_fig fig_shm_ipc_write ipc "${IPC[@]}" --op write "${F[@]}"
    iw=$FIG
    eng_fig fig_shm_ipc_read ipc "${IPC[@]}" --op read "${F[@]}"
    ir=$FIG
    eng_fig fig_shm_ipc_write_chunk64M ipc OTE_GPU_STAGING_CHUNK=64M "${IPC[@]}" --op write "${F[@]}"
    iw64=$FIG
    eng_fig fig_shm_ipc_read_chunk64M ipc OTE_GPU_STAGING_CHUNK=64M "${IPC[@]}" --op read "${F[@]}"
    ir64=$FIG

    note ""
    if [ "$USE_FAKE" = 1 ]; then
        note "ENGINE FIGURES over the FAKE libcuda: its 'GPU copies' are memcpys on CPU threads;"
        note "these numbers only show that the phase runs, they say NOTHING about speed."
    else
        note "ENGINE FIGURES (issue 12; same run, back to back; GB/s = 1e9 bytes/s)"
    fi
    note "$(printf '%-44s %9s %-22s %9s %6s %6s  %s' figure GB/s 'against' GB/s ratio target verdict)"
    r=$(ratio "$sw" "$hw")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'TCP WRITE 64M b1 cuda:0->cuda:0 (staged)' \
        "$(fmt "$sw")" 'TCP WRITE host->host' "$(fmt "$hw")" "$r" 0.9 "$(verdict "$r" 0.9)")")
    r=$(ratio "$sr" "$hr")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'TCP READ 64M b1 cuda:0->cuda:0 (staged)' \
        "$(fmt "$sr")" 'TCP READ host->host' "$(fmt "$hr")" "$r" 0.9 "$(verdict "$r" 0.9)")")
    r=$(ratio "$iw" "$dtod")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'shm WRITE 64M b1 cuda:0->cuda:0 (IPC)' \
        "$(fmt "$iw")" 'cuMemcpyDtoD 64M' "$(fmt "$dtod")" "$r" 0.8 "$(verdict "$r" 0.8)")")
    r=$(ratio "$ir" "$dtod")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'shm READ 64M b1 cuda:0->cuda:0 (IPC)' \
        "$(fmt "$ir")" 'cuMemcpyDtoD 64M' "$(fmt "$dtod")" "$r" 0.8 "$(verdict "$r" 0.8)")")
    r=$(ratio "$iw64" "$dtod")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'shm WRITE IPC, gpu_staging_chunk=64M (info)' \
        "$(fmt "$iw64")" 'cuMemcpyDtoD 64M' "$(fmt "$dtod")" "$r" - -)")
    r=$(ratio "$ir64" "$dtod")
    rows+=("$(printf '%-44s %9s %-22s %9s %6s %6s  %s' 'shm READ IPC, gpu_staging_chunk=64M (info)' \
        "$(fmt "$ir64")" 'cuMemcpyDtoD 64M' "$(fmt "$dtod")" "$r" - -)")
    for r in "${rows[@]}"; do note "$r"; done

    # ---- the staging sweep: gpu_staging_chunk x gpu_staging_depth, TCP READ staged ----
    local chunks=(1M 2M 4M 8M) depths=(2 4 8) c d g best="" bestg="" def="" hdr
    local -A grid=()
    for c in "${chunks[@]}"; do
        for d in "${depths[@]}"; do
            eng_fig "sweep_read_c${c}_d$d" staging OTE_GPU_PATHS=staging OTE_GPU_STAGING_CHUNK="$c" \
                OTE_GPU_STAGING_DEPTH="$d" -- --transport tcp --op read --local-mem cuda:0 \
                --remote-mem cuda:0 "${F[@]}"
            g=$FIG
            grid[$c,$d]=$g
            [ "$c" = 2M ] && [ "$d" = 4 ] && def=$g
            if [ -n "$g" ] && { [ -z "$bestg" ] || awk -v a="$g" -v b="$bestg" 'BEGIN { exit !(a > b) }'; }; then
                bestg=$g best="chunk $c depth $d"
            fi
        done
    done
    note ""
    note "STAGING SWEEP: TCP READ 64M b1 cuda:0->cuda:0 staged, GB/s (default: chunk 2M, depth 4)"
    hdr=$(printf '%-16s' 'chunk \ depth')
    for d in "${depths[@]}"; do hdr+=$(printf ' %8s' "$d"); done
    note "$hdr"
    for c in "${chunks[@]}"; do
        line=$(printf '%-16s' "$c")
        for d in "${depths[@]}"; do line+=$(printf ' %8s' "$(fmt "${grid[$c,$d]}")"); done
        note "$line"
    done
    [ -n "$best" ] && note "best: $best, $(fmt "$bestg") GB/s = $(ratio "$bestg" "$def")x the default's" \
        "$([ "$USE_FAKE" = 1 ] && echo '(fake driver: meaningless)')"
    note "(each cell one ${ENGINE_FIG_SECS}s run; logs: gpu_check_logs/engine_* of $OUT/gpu_check_logs.tar.gz)"
}
