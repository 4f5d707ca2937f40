#!/usr/bin/env bash
# Entrypoint of the emulator actor host image (deploy/emulator/Dockerfile; README.md there).
#
#   entrypoint.sh [ACTOR FLAGS...]     start an adb server and NUM_EMULATORS headless emulators of AVD_NAME
#                                      (consoles on 5554, 5556, ...: serials emulator-5554, emulator-5556, ...),
#                                      wait until each reports sys.boot_completed=1, then become
#                                      `python -m actors --backend adb --adb.serials ...` (extra flags appended)
#   entrypoint.sh save-snapshot NAME   cold-boot one emulator, save its state as snapshot NAME in the AVD, stop
#
# The emulators run in sessions of their own, adopted by the container's init (tini), so an emulator that
# exits is noticed (and reaped) while the actor runs: the actor is then stopped (SIGTERM: it flushes what
# the learner has not acknowledged) and the container ends, for its restart policy to boot everything
# again. Every problem found before the actor starts is one message on stderr and exit status 1.
set -euo pipefail

LEARNER_HOST=${LEARNER_HOST:-}
INGEST_PORT=${INGEST_PORT:-7555}
PARAMS_PORT=${PARAMS_PORT:-7556}
NUM_EMULATORS=${NUM_EMULATORS:-2}
AVD_NAME=${AVD_NAME:-phone}
EMULATOR_PORT=${EMULATOR_PORT:-5554}
EMULATOR_ARGS=${EMULATOR_ARGS:-}
SNAPSHOT=${SNAPSHOT:-}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-600}
BOOT_POLL=${BOOT_POLL:-2}
DISABLE_ANIMATIONS=${DISABLE_ANIMATIONS:-1}
TASKS=${TASKS:-stock}
CURVE_SECRET_KEY=${CURVE_SECRET_KEY:-}
CURVE_SERVER_KEY=${CURVE_SERVER_KEY:-}
KVM_DEVICE=${KVM_DEVICE:-/dev/kvm}
EMULATOR_LOG_DIR=${EMULATOR_LOG_DIR:-/tmp/emulators}
WATCH_INTERVAL=${WATCH_INTERVAL:-5}
AVD_HOME=${ANDROID_AVD_HOME:-${HOME:-/root}/.android/avd}

pids=()    # one per emulator: its pid, which is also its process group (setsid)
serials=()

say() { echo "entrypoint: $*"; }
alive() {  # $1: pid. An exited process that init has not reaped yet (a zombie) counts as gone.
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }  # the fields after "(command name) "
    [[ ${stat:0:1} != Z ]]
}
die() {
    echo "entrypoint: error: $*" >&2
    exit 1
}

stop_emulators() {  # SIGTERM to each emulator's process group, SIGKILL to what is left after 10 s
    local pid left t
    if ((${#pids[@]} == 0)); then return 0; fi
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for t in $(seq 50); do
        left=0
        for pid in "${pids[@]}"; do
            if alive "$pid"; then left=1; fi
        done
        if ((left == 0)); then return 0; fi
        sleep 0.2
    done
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap stop_emulators EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---- settings ----

is_uint() { [[ $1 =~ ^(0|[1-9][0-9]*)$ ]]; }

check_settings() {  # $1: "actor" or "snapshot"
    local name
    for name in EMULATOR_PORT NUM_EMULATORS BOOT_TIMEOUT INGEST_PORT PARAMS_PORT; do
        is_uint "${!name}" || die "$name must be a whole number, not '${!name}'"
    done
    [[ $BOOT_POLL =~ ^[0-9]+(\.[0-9]+)?$ && $WATCH_INTERVAL =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
        die "BOOT_POLL and WATCH_INTERVAL must be numbers of seconds, not '$BOOT_POLL' and '$WATCH_INTERVAL'"
    ((BOOT_TIMEOUT > 0)) || die "BOOT_TIMEOUT must be > 0 seconds"
    # adb finds emulators by their console ports 5554..5584 (adb ports 5555..5585): 16 at most
    if ((EMULATOR_PORT % 2 || EMULATOR_PORT < 5554 || NUM_EMULATORS < 1 ||
        EMULATOR_PORT + 2 * NUM_EMULATORS - 2 > 5584)); then
        die "NUM_EMULATORS=$NUM_EMULATORS from EMULATOR_PORT=$EMULATOR_PORT does not fit adb's emulator ports" \
            "5554..5584 (an even first port, at most 16 emulators)"
    fi
    [[ -n $AVD_NAME && -d $AVD_HOME/$AVD_NAME.avd ]] ||
        die "no AVD '$AVD_NAME' in $AVD_HOME (AVD_NAME; the image creates it with avdmanager)"
    [[ $1 == snapshot ]] && return 0
    [[ -n $LEARNER_HOST ]] || die "LEARNER_HOST is not set: the learner's address (its LAN address or DNS name)"
    local port
    for port in "$INGEST_PORT" "$PARAMS_PORT"; do
        ((port >= 1 && port <= 65535)) || die "INGEST_PORT and PARAMS_PORT must be in 1..65535, not $port"
        if ((port >= 5554 && port <= 5585)); then
            say "warning: learner port $port is in adb's emulator range 5554..5585 (use 7555/7556)" >&2
        fi
    done
    if [[ -n $SNAPSHOT && ! -d $AVD_HOME/$AVD_NAME.avd/snapshots/$SNAPSHOT ]]; then
        die "SNAPSHOT=$SNAPSHOT: no such snapshot in $AVD_HOME/$AVD_NAME.avd/snapshots;" \
            "make it once with \`entrypoint.sh save-snapshot $SNAPSHOT\` (README.md)"
    fi
}

check_kvm() {
    if [[ ! -e $KVM_DEVICE ]]; then
        die "$KVM_DEVICE is missing: the emulators need KVM. Run the container with --device /dev/kvm" \
            "(compose: devices: [/dev/kvm]) on a host that has it: bare metal, or a VM with nested" \
            "virtualization (on the host: ls -l /dev/kvm)"
    fi
    if [[ ! -r $KVM_DEVICE || ! -w $KVM_DEVICE ]]; then
        die "$KVM_DEVICE is there but user $(id -un) cannot open it for reading and writing: run the container" \
            "as root, or add the device's group (stat -c %g /dev/kvm on the host) with --group-add / group_add"
    fi
}

# ---- emulators ----

launch() {  # $1: index (port EMULATOR_PORT + 2 * index); the rest: snapshot flags
    local port=$((EMULATOR_PORT + 2 * $1)) extra pid
    shift
    local log=$EMULATOR_LOG_DIR/emulator-$port.log
    read -r -a extra <<<"$EMULATOR_ARGS"
    local cmd=(emulator -avd "$AVD_NAME" -port "$port" -no-window -no-audio -no-boot-anim
        -gpu swiftshader_indirect -accel on "$@" "${extra[@]}")
    say "emulator-$port: ${cmd[*]} (output in $log)"
    # setsid: a process group of its own, stopped as one; $( ... & ): init adopts it, and reaps it when it exits
    pid=$(setsid "${cmd[@]}" </dev/null >>"$log" 2>&1 & echo $!)
    pids+=("$pid")
    serials+=("emulator-$port")
}

log_tail() {  # $1: serial
    local log=$EMULATOR_LOG_DIR/$1.log
    [[ -s $log ]] && printf '\n--- the end of %s ---\n%s' "$log" "$(tail -n 20 "$log")"
    return 0
}

boot_state() {  # $1: serial; prints sys.boot_completed ("1" once booted), empty when adb gets no answer
    timeout 10 adb -s "$1" shell getprop sys.boot_completed 2>/dev/null | tr -d '\r\n' || true
}

wait_booted() {
    local start=$SECONDS i serial state note
    local deadline=$((SECONDS + BOOT_TIMEOUT))
    for i in "${!serials[@]}"; do
        serial=${serials[i]}
        note=$((SECONDS + 30))
        while :; do
            alive "${pids[i]}" || die "$serial: the emulator exited while booting$(log_tail "$serial")"
            state=$(boot_state "$serial")
            [[ $state == 1 ]] && break
            ((SECONDS < deadline)) ||
                die "$serial: not booted after BOOT_TIMEOUT=$BOOT_TIMEOUT s" \
                    "(sys.boot_completed: '${state:-no answer}')$(log_tail "$serial")"
            if ((SECONDS >= note)); then
                say "$serial: booting, $((SECONDS - start)) s of $BOOT_TIMEOUT s"
                note=$((SECONDS + 30))
            fi
            sleep "$BOOT_POLL"
        done
        say "$serial: booted after $((SECONDS - start)) s"
    done
}

prepare() {  # $1: serial. Keep the screen on and unlocked, and (DISABLE_ANIMATIONS=1) animations off.
    local script="svc power stayon true; wm dismiss-keyguard"
    if [[ $DISABLE_ANIMATIONS == 1 ]]; then
        script+="; settings put global window_animation_scale 0; settings put global transition_animation_scale 0"
        script+="; settings put global animator_duration_scale 0"
    fi
    timeout 30 adb -s "$1" shell "$script" >/dev/null 2>&1 || say "warning: $1: could not run: $script" >&2
}

watch_emulators() {  # in the background: once an emulator is gone, stop the actor (this process after exec)
    local actor=$$
    (
        trap - EXIT TERM INT
        while sleep "$WATCH_INTERVAL"; do
            alive "$actor" || exit 0
            for i in "${!pids[@]}"; do
                if ! alive "${pids[i]}"; then
                    echo "entrypoint: ${serials[i]} exited; stopping the actor$(log_tail "${serials[i]}")" >&2
                    kill -TERM "$actor" 2>/dev/null
                    exit 0
                fi
            done
        done
    ) </dev/null &
}

start_adb() {  # before the emulators: the server makes ~/.android/adbkey, which they authorize at boot
    mkdir -p "$EMULATOR_LOG_DIR"
    adb start-server >/dev/null 2>&1 || die "adb start-server failed (is the SDK's platform-tools on PATH?)"
}

# ---- the two commands ----

save_snapshot() {  # $1: snapshot name
    local name=${1:-}
    [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "usage: entrypoint.sh save-snapshot NAME (letters, digits, . _ -)"
    NUM_EMULATORS=1
    check_settings snapshot
    check_kvm
    start_adb
    launch 0 -no-snapshot-load   # a cold boot, writable (no -read-only): the snapshot goes into the AVD
    wait_booted
    prepare "${serials[0]}"
    local out
    out=$(timeout 300 adb -s "${serials[0]}" emu avd snapshot save "$name" 2>&1 | tr -d '\r') || true
    [[ $out == *OK* && $out != *KO* ]] || die "${serials[0]}: saving snapshot $name failed: ${out:-no answer}"
    timeout 60 adb -s "${serials[0]}" emu kill >/dev/null 2>&1 || true
    local t
    for t in $(seq 300); do
        alive "${pids[0]}" || break
        sleep 0.2
    done
    say "saved snapshot $name of AVD $AVD_NAME in $AVD_HOME/$AVD_NAME.avd/snapshots/$name;" \
        "boot from it with SNAPSHOT=$name"
}

run_actor() {
    check_settings actor
    check_kvm
    start_adb
    local i boot=(-no-snapshot-load)
    # -read-only: several emulators share the AVD, and nothing they do is written back to it
    [[ -n $SNAPSHOT ]] && boot=(-snapshot "$SNAPSHOT")
    for ((i = 0; i < NUM_EMULATORS; i++)); do launch "$i" -read-only -no-snapshot-save "${boot[@]}"; done
    wait_booted
    for i in "${serials[@]}"; do prepare "$i"; done

    local args=(--host "$LEARNER_HOST" --ingest-port "$INGEST_PORT" --params-port "$PARAMS_PORT"
        --backend adb --adb.serials "${serials[@]}" --tasks "$TASKS")
    [[ -n $SNAPSHOT ]] && args+=(--adb.snapshot "$SNAPSHOT")  # every reset loads it again
    [[ -n $CURVE_SECRET_KEY ]] && args+=(--curve-secret-key "$CURVE_SECRET_KEY")
    [[ -n $CURVE_SERVER_KEY ]] && args+=(--curve-server-key "$CURVE_SERVER_KEY")
    args+=("$@")
    # If no adb server answers, adbutils starts one with the adb it finds: let that be the SDK's, the same
    # version as the server started above (adb clients kill servers of another version).
    ADBUTILS_ADB_PATH=$(command -v adb)
    export ADBUTILS_ADB_PATH
    watch_emulators
    trap - EXIT TERM INT
    say "starting the actor: python -m actors ${args[*]}"
    exec python -m actors "${args[@]}"
}

if [[ ${1:-} == save-snapshot ]]; then
    shift
    save_snapshot "$@"
else
    run_actor "$@"
fi
