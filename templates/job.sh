# The job, written once. Every reproflow job script sources this file: the committed sbatch/<suite>.sbatch
# scripts (`make sbatch`) and the scripts `reproflow submit` writes, after each has set what differs between
# jobs (SUITE, SUITE_NAME, IMAGE and the defaults below it may fix). It checks the runtime, puts each step
# in the image (Pyxis, Slurm's OCI support or Apptainer), picks the rendezvous port and the MPI launcher,
# starts the image on every node before anything is measured, and defines run_experiment,
# run_mpi_experiment and finish, which the job script calls. It is not rendered: a change here changes
# every job at once, with no script in sbatch/ to render again; tests/golden/ shows what each job then
# runs (REPROFLOW_GOLDEN=write pytest tests/test_jobs.py rewrites it, for review).

###########################
###### User Variables #####
###########################
# Each can be set at submit time: sbatch --export=NONE,NAME=value,... sbatch/<suite>.sbatch
: "${CONTAINER_RUNTIME:=pyxis}"  # pyxis, oci (srun --container + oci.conf) or apptainer
: "${OCI_CACHE:=${IMAGE%.sqsh}.oci}"  # oci: the image unpacked (once per sha256) and per-job bundles, shared
REPROFLOW_CHECKOUT=$(cd "$REPROFLOW_CHECKOUT" && pwd)  # the job script's: its path, without any ..
if [ -n "$IMAGE" ]; then               # reproflow checkout: inside the image, or the one this job came from
    : "${REPROFLOW_DIR:=/opt/reproflow}"
else
    : "${REPROFLOW_DIR:=$REPROFLOW_CHECKOUT}"
fi
: "${RESULTS:=${SLURM_SUBMIT_DIR:-$PWD}/results}" # on a filesystem every node mounts
: "${WORKDIR:=${SLURM_SUBMIT_DIR:-$PWD}}"         # the steps' working folder: the suite's relative paths
if [[ $RESULTS/ == "$WORKDIR"/* ]]; then          # (work folders, configs) resolve there, in a container too
    : "${CONTAINER_MOUNTS:=$WORKDIR:$WORKDIR}"
else
    : "${CONTAINER_MOUNTS:=$WORKDIR:$WORKDIR,$RESULTS:$RESULTS}"
fi
: "${VENV:=$REPROFLOW_DIR/.venv}"                 # no container: virtualenv to activate (if present)
: "${PROCS_PER_NODE:=}"                           # ranks per node; empty: each experiment's own setting
# The rendezvous port: one per job sharing a node, below Linux's ephemeral ports (32768 and up), where any
# outgoing connection may hold a port and the rendezvous then fails to listen (EADDRINUSE).
: "${MASTER_PORT:=$(( 20000 + ${SLURM_JOB_ID:-0} % 10000 ))}"
: "${SET:=}"                                      # parameter overrides, e.g. SET="end_size=1M iters=5"
: "${FORCE:=0}"                                   # 1: measure again points that have results
: "${MPI_LAUNCHER:=auto}"  # MPI experiments: srun, mpirun_rsh (MVAPICH2), hydra (MPICH by hand), or auto: hydra
                           # under CONTAINER_RUNTIME=oci, mpirun_rsh if found and no IMAGE, else srun
: "${SRUN_MPI:=}"          # srun --mpi plugin: pmix (Open MPI / HPC-X), pmi2 (MPICH); empty: the one the
                           # image's environment names (REPROFLOW_SRUN_MPI: pmix gpu, pmi2 cpu), else pmix
case $SUITE in /*) ;; *) SUITE=$REPROFLOW_DIR/$SUITE ;; esac  # a suite of the checkout: as the job sees it

###########################
## Environment Variables ##
###########################
export FI_EFA_USE_DEVICE_RDMA=1 # use for p4d
export FI_EFA_FORK_SAFE=1
export FI_LOG_LEVEL=1
export FI_PROVIDER=efa # change to eth if you want to use ENA for comparisons
export FI_EFA_ENABLE_SHM_TRANSFER=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_DEBUG=INFO
# export NCCL_ALGO=Ring
# export NCCL_SOCKET_IFNAME=ens
export PYTHONUNBUFFERED=1
export REPROFLOW_IMAGE="$IMAGE"

fail() { echo "reproflow: $*" >&2; exit 2; }
json_string() { local v=${1//\\/\\\\}; v=${v//\"/\\\"}; printf '"%s"' "$v"; }
# oci: the bundle's config.json (OCI runtime spec). The host's network and UTS namespaces, as under Pyxis
# (ranks reach each other by node name); the image's environment from /etc/environment, as Enroot reads
# it; /etc/hosts and CONTAINER_MOUNTS bound in. Slurm adds the job's environment and the command.
oci_config() {
    local uid gid line pair src dst namespaces='{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}' ids=""
    local -a env=() pairs=()
    uid=$(id -u) gid=$(id -g)
    while IFS= read -r line; do
        if [[ $line =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then env+=("$(json_string "$line")"); fi
    done < <(cat "$OCI_ROOTFS/etc/environment" 2>/dev/null)
    [ ${#env[@]} -gt 0 ] || env=('"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"')
    # Rootless runc (a user other than root) maps that user into a user namespace.
    if [ "$uid" != 0 ]; then
        namespaces+=', {"type": "user"}'
        ids=", \"uidMappings\": [{\"containerID\": $uid, \"hostID\": $uid, \"size\": 1}], \"gidMappings\": [{\"containerID\": $gid, \"hostID\": $gid, \"size\": 1}]"
    fi
    printf '{"ociVersion": "1.0.2",\n "process": {"user": {"uid": %s, "gid": %s}, "args": ["true"], "cwd": %s,\n' \
        "$uid" "$gid" "$(json_string "$WORKDIR")"
    printf '  "env": [%s], "noNewPrivileges": true},\n "root": {"path": "rootfs", "readonly": true},\n' \
        "$(IFS=,; echo "${env[*]}")"
    printf ' "mounts": [\n'
    printf '  {"destination": "/proc", "type": "proc", "source": "proc"},\n'
    printf '  {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},\n'
    printf '  {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},\n'
    printf '  {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777"]},\n'
    printf '  {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},\n'
    printf '  {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},\n'
    printf '  {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["rbind", "ro"]}'
    IFS=, read -r -a pairs <<< "$CONTAINER_MOUNTS"
    for pair in "${pairs[@]}"; do
        src=${pair%%:*} dst=${pair#*:}
        dst=${dst%%:*}
        printf ',\n  {"destination": %s, "type": "bind", "source": %s, "options": ["rbind", "rw"]}' \
            "$(json_string "$dst")" "$(json_string "$src")"
    done
    printf '],\n "linux": {"namespaces": [%s]%s}}\n' "$namespaces" "$ids"
}
# srun options (CONTAINER) and a command prefix (IN_CONTAINER) that put each step in the image.
declare -a CONTAINER=() IN_CONTAINER=()
if [ -n "$IMAGE" ]; then
    case "$IMAGE" in
        /*|./*) [ -f "$IMAGE" ] || fail "IMAGE=$IMAGE does not exist. Build it with 'make containers', or submit with --export=IMAGE= to run without a container." ;;
        *) fail "IMAGE=$IMAGE is not an absolute or ./ path: Pyxis would pull it from a registry. Give the squash file's path (./$IMAGE or absolute)." ;;
    esac
    [ "$(head -c 4 "$IMAGE")" = hsqs ] || fail "IMAGE=$IMAGE is not a squash file (it does not start with squashfs' magic); build one with 'make containers'."
    # A squash file records its own length (bytes_used, at byte 40): a shorter file is a copy cut short.
    squash_bytes=$(od -An -t u8 -j 40 -N 8 "$IMAGE" | tr -d ' ') image_bytes=$(stat -L -c %s "$IMAGE")
    [ "$squash_bytes" -le "$image_bytes" ] || fail "IMAGE=$IMAGE is cut short: it holds $image_bytes bytes of the $squash_bytes its squashfs header records. Copy it again, or rebuild it with 'make containers'."
    if [ -f "$IMAGE.sha256" ]; then read -r REPROFLOW_IMAGE_SHA256 _ < "$IMAGE.sha256"; else REPROFLOW_IMAGE_SHA256=$(sha256sum "$IMAGE" | cut -d' ' -f1); fi
    export REPROFLOW_IMAGE_SHA256 REPROFLOW_CONTAINER_RUNTIME=$CONTAINER_RUNTIME
    case "$CONTAINER_RUNTIME" in
        pyxis)
            srun --help 2>/dev/null | grep -q -- --container-image || fail "CONTAINER_RUNTIME=pyxis, but srun does not know --container-image: Pyxis is not installed or not enabled (plugstack.conf). Use CONTAINER_RUNTIME=oci or apptainer, or IMAGE= for no container."
            # One container per node for the whole job (pyxis_start makes it): Pyxis unpacks the squash file
            # once per node, not once per step. Named after the image's content, so where Pyxis keeps named
            # containers past their job (container_scope=global) a later job reuses it only for the same image.
            CONTAINER=(--container-image "$IMAGE" --container-name "reproflow-${REPROFLOW_IMAGE_SHA256:0:16}"
                       --container-mounts "$CONTAINER_MOUNTS" --container-workdir "$WORKDIR") ;;
        oci)
            [ -f "$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")/oci.conf" ] || fail "CONTAINER_RUNTIME=oci, but this node has no oci.conf beside slurm.conf: Slurm's OCI support is not set up (see docs/cluster.md). Use pyxis or apptainer, or IMAGE= for no container."
            command -v unsquashfs >/dev/null || fail "CONTAINER_RUNTIME=oci unpacks the squash file with unsquashfs, which is not installed (squashfs-tools)."
            # The image unpacked once per content; runc wants a real directory, so each job's bundle gets a
            # hard-linked copy (read-only inside the container) and its own config.json with its mounts.
            OCI_ROOTFS="$OCI_CACHE/$REPROFLOW_IMAGE_SHA256"
            if [ ! -d "$OCI_ROOTFS" ]; then
                mkdir -p "$OCI_CACHE"
                unsquashfs -q -n -d "$OCI_ROOTFS.$SLURM_JOB_ID" "$IMAGE" >/dev/null || fail "unsquashfs could not unpack $IMAGE into $OCI_CACHE"
                mv -T "$OCI_ROOTFS.$SLURM_JOB_ID" "$OCI_ROOTFS" 2>/dev/null || rm -rf "$OCI_ROOTFS.$SLURM_JOB_ID"
            fi
            # Whoever can write the cache can plant the root this job runs: use one this user made, that
            # others cannot write, in a cache others cannot write.
            { [ "$(stat -c %u "$OCI_ROOTFS")" = "$(id -u)" ] && [ -z "$(find "$OCI_CACHE" "$OCI_ROOTFS" -maxdepth 0 -perm -o+w)" ]; } \
                || fail "$OCI_ROOTFS (the unpacked image) is not this user's, or it or $OCI_CACHE is writable by others: anyone who can write there could plant the root this job runs. Set OCI_CACHE to a folder of your own that others cannot write."
            OCI_BUNDLE="$OCI_CACHE/job-$SLURM_JOB_ID"
            rm -rf "$OCI_BUNDLE" && mkdir -p "$OCI_BUNDLE"
            trap 'rm -rf "$OCI_BUNDLE"' EXIT
            cp -al "$OCI_ROOTFS" "$OCI_BUNDLE/rootfs"
            oci_config > "$OCI_BUNDLE/config.json"
            CONTAINER=(--container="$OCI_BUNDLE") ;;
        apptainer)
            command -v apptainer >/dev/null || fail "CONTAINER_RUNTIME=apptainer, but apptainer is not installed here. Use pyxis or oci, or IMAGE= for no container."
            IN_CONTAINER=(apptainer exec --bind "$CONTAINER_MOUNTS" --pwd "$WORKDIR" "$IMAGE") ;;
        *) fail "CONTAINER_RUNTIME=$CONTAINER_RUNTIME is not one of pyxis, oci, apptainer." ;;
    esac
elif [ -f "$VENV/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
mkdir -p "$RESULTS"
cd "$WORKDIR" || fail "WORKDIR=$WORKDIR is not a folder this node can enter."
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
declare -a EXTRA=()
if [ "$FORCE" = 1 ]; then EXTRA+=(--force); fi
read -r -a SET_ITEMS <<< "$SET"  # split on blanks, no glob expansion
# SETS: the submitting command's --set values, one word each whatever they hold (reproflow submit).
for kv in "${SET_ITEMS[@]}" ${SETS[@]+"${SETS[@]}"}; do EXTRA+=(--set "$kv"); done
# In a job array (sbatch --array=0-N%K), task i measures point i of each experiment.
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then EXTRA+=(--point "$SLURM_ARRAY_TASK_ID"); fi
echo "reproflow: job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s) [$SLURM_JOB_NODELIST], rendezvous $HEAD_NODE:$MASTER_PORT, image '${IMAGE:-none}', results $RESULTS"

# Pyxis: Enroot on every node, then the job's container made on every node before the first step, so that
# a node without Enroot, a squash file Enroot cannot unpack or a mount whose host folder is missing stops
# the job here, named, before anything is measured. Each node's Enroot version goes into every row.
pyxis_start() {
    local found missing out nodes source
    found=$(srun --export=ALL --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 bash -c 'echo "$(hostname) $(enroot version 2>/dev/null || echo none)"') \
        || fail "a step looking for enroot on every node failed (Slurm's words above)."
    missing=$(awk '$2 == "none" {print $1}' <<< "$found" | sort | paste -sd, -)
    [ -z "$missing" ] || fail "enroot is not installed on $missing, and Pyxis runs it on every node of a job: install Enroot there (github.com/NVIDIA/enroot), or keep the job off it (sbatch --exclude=$missing)."
    REPROFLOW_ENROOT_VERSION=$(awk '{print $2}' <<< "$found" | sort -u | paste -sd, -)
    export REPROFLOW_ENROOT_VERSION
    echo "reproflow: enroot $REPROFLOW_ENROOT_VERSION on $(awk '{print $1}' <<< "$found" | sort | paste -sd, -); starting the image on every node"
    if out=$(srun --export=ALL "${CONTAINER[@]}" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 true 2>&1); then return; fi
    printf '%s\n' "$out" >&2
    nodes=$(sed -n 's/^slurmstepd-\([^:]*\): error: pyxis: \(--container-mounts: source path does not exist\|failed to create container filesystem\).*/\1/p' <<< "$out" | sort -u | paste -sd, -)
    source=$(sed -n 's/.*pyxis: --container-mounts: source path does not exist: //p' <<< "$out" | head -n 1)
    [ -z "$source" ] || fail "CONTAINER_MOUNTS names $source, which does not exist on ${nodes:-a node}: create it there (a filesystem every node mounts), or change CONTAINER_MOUNTS."
    grep -q "pyxis: failed to create container filesystem" <<< "$out" && fail "Enroot could not unpack IMAGE=$IMAGE on ${nodes:-a node} (its words above): a corrupt squash file, or no room under Enroot's data path there. Rebuild it with 'make containers', or copy it again and compare it with $IMAGE.sha256."
    fail "the image did not start through Pyxis on every node (Pyxis' and Enroot's words above); 'reproflow doctor --image $IMAGE' checks this node."
}
if [ -n "$IMAGE" ] && [ "$CONTAINER_RUNTIME" = pyxis ]; then pyxis_start; fi

failed=0
run_experiment() {
    local name=$1 procs=$2
    echo "reproflow: experiment $name with ${procs} rank(s) per node"
    # --export=ALL: the job was submitted with --export=NONE, which srun would inherit otherwise. One
    # torchrun per node whatever tasks the job asked for (a submitted job asks for one per rank).
    srun --export=ALL "${CONTAINER[@]}" -l --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "${IN_CONTAINER[@]}" \
        torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node="$procs" \
        --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:$MASTER_PORT" \
        -m reproflow.worker --suite "$SUITE" --experiment "$name" \
        --results "$RESULTS" --root "$REPROFLOW_DIR" "${EXTRA[@]}" || failed=$((failed + 1))
}

# MPICH's hydra started by hand (CONTAINER_RUNTIME=oci): Slurm's OCI support runs one task per node and
# passes no PMI, so mpiexec, in the image on the first node, prints each node's proxy command, and srun
# starts that proxy in the image on its node.
hydra_launch() {
    local procs=$1 line pid rc out i=0
    shift
    local -a hosts proxy
    mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    coproc HYDRA { srun --export=ALL --overlap "${CONTAINER[@]}" -N1 -n1 -w "${hosts[0]}" mpiexec -launcher manual \
        -hosts "$(IFS=,; echo "${hosts[*]}")" -ppn "$procs" -n "$((SLURM_JOB_NUM_NODES * procs))" "$@" 2>&1; }
    pid=$HYDRA_PID
    exec {out}<&"${HYDRA[0]}"
    while IFS= read -r line <&"$out"; do
        case $line in
            HYDRA_LAUNCH_END*) break ;;
            HYDRA_LAUNCH:*)
                read -r -a proxy <<< "${line#HYDRA_LAUNCH: }"
                srun --export=ALL --overlap "${CONTAINER[@]}" -N1 -n1 -w "${hosts[i]}" "${proxy[@]}" &
                i=$((i + 1)) ;;
            *) printf '%s\n' "$line" ;;
        esac
    done
    cat <&"$out"
    rc=0
    wait "$pid" || rc=$?
    wait
    exec {out}<&-
    return "$rc"
}

# The srun --mpi plugin for the image's MPI: what its /etc/environment names (the image's ENV, as Enroot
# and the OCI bundles read it), else pmix.
image_srun_mpi() {
    local plugin=""
    [ -z "$IMAGE" ] || plugin=$(unsquashfs -cat "$IMAGE" etc/environment 2>/dev/null | sed -n 's/^REPROFLOW_SRUN_MPI=//p')
    echo "${plugin:-pmix}"
}

run_mpi_experiment() {
    local name=$1 procs=$2 launcher=$MPI_LAUNCHER
    # python -m mpi4py: a rank that raises aborts the whole job instead of leaving the others waiting.
    local -a worker=(python -m mpi4py -m reproflow.worker --suite "$SUITE" --experiment "$name"
                     --results "$RESULTS" --root "$REPROFLOW_DIR" "${EXTRA[@]}")
    if [ "$launcher" = auto ]; then
        if [ -n "$IMAGE" ] && [ "$CONTAINER_RUNTIME" = oci ]; then launcher=hydra
        elif [ -z "$IMAGE" ] && command -v mpirun_rsh >/dev/null 2>&1; then launcher=mpirun_rsh
        else launcher=srun; fi
    fi
    if [ "$launcher" = srun ]; then launcher="srun --mpi=${SRUN_MPI:=$(image_srun_mpi)}"; fi
    echo "reproflow: experiment $name with ${procs} MPI rank(s) per node through $launcher"
    case ${launcher%% *} in
        mpirun_rsh)
            local hostfile="$RESULTS/.hostfile-${SLURM_JOB_ID}"
            scontrol show hostnames "$SLURM_JOB_NODELIST" | awk -v n="$procs" '{ for (i = 0; i < n; i++) print }' > "$hostfile"
            mpirun_rsh --export-all -np "$((SLURM_JOB_NUM_NODES * procs))" --hostfile "$hostfile" \
                MV2_USE_CUDA=1 MV2_HYBRID_BINDING_POLICY=spread MV2_CPU_BINDING_POLICY=hybrid MV2_USE_GDRCOPY=0 \
                PYTHONNOUSERSITE=true LD_PRELOAD="${MV2_HOME:-}/lib/libmpi.so" "${worker[@]}" ;;
        hydra) hydra_launch "$procs" "${worker[@]}" ;;
        *) srun --export=ALL --mpi="$SRUN_MPI" "${CONTAINER[@]}" -l --ntasks="$((SLURM_JOB_NUM_NODES * procs))" \
               --ntasks-per-node="$procs" "${IN_CONTAINER[@]}" "${worker[@]}" ;;
    esac || failed=$((failed + 1))
}

# The job's end: its exit status is the number of experiments that failed.
finish() {
    echo "reproflow: results in $RESULTS/$SUITE_NAME; tables and figures: reproflow report --results $RESULTS"
    exit "$failed"
}
