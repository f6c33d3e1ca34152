# reproflow's images: one Dockerfile whose two flavours share every step but the base and the CUDA-only
# ones (`make containers` builds them and squashes them for Enroot; containers/build.sh):
#   gpu (STACK=gpu-stack, the default) for p4d/p5 nodes: a CUDA base, EFA + aws-ofi-nccl, NCCL at torch's
#       release, CUDA-aware Open MPI with mpi4py built against it, NVIDIA apex with its CUDA extensions,
#       DeepSpeed's CUDA ops, param at the recipe's commit, and nccl-tests
#   cpu (STACK=cpu-stack, BASE_IMAGE a Debian 12 image): MPI is the mpich wheel; make test builds it and
#       runs every family inside it under Slurm
# Python packages come at exactly the versions of constraints.txt (PIP_CONSTRAINT), the file the tests'
# virtual environment is installed from: torch 2.13.0 is its CUDA build from TORCH_INDEX_URL in the gpu
# flavour, the CPU build in the cpu flavour. Everything else is pinned below.
#   docker build --target image -t reproflow-gpu -f containers/reproflow.Dockerfile .
ARG BASE_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu22.04
ARG STACK=gpu-stack
# The lock is resolved for Python 3.11: Debian 12's python3, and a universe package on Ubuntu 22.04.
ARG PYTHON=python3.11

FROM ${BASE_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
ARG PYTHON
RUN apt-get update \
 && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# A virtual environment at /usr/local: its python, pip and torchrun are first on every PATH, whatever
# environment a runtime (Pyxis, Slurm's OCI support, Apptainer) gives the job.
RUN "${PYTHON}" -m venv /usr/local
ENV PIP_CONSTRAINT=/opt/reproflow/constraints.txt PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# torch's CUDA build (2.13.0+cu130 outranks PyPI's 2.13.0, also a CUDA 13.0 build, for the same pin). PIP_NO_INDEX=1 (the cpu
# flavour built by make containers) installs only from /opt/wheels, the wheels it prepared with the
# machine's own pip configuration and mounts there; otherwise /opt/wheels does not exist.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG PIP_NO_INDEX=0
COPY constraints.txt pyproject.toml containers/requirements.py /opt/reproflow/
RUN python /opt/reproflow/requirements.py /opt/reproflow/pyproject.toml megatron deepspeed mpi > /tmp/requirements.txt \
 && pip install --find-links /opt/wheels --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

FROM python AS cpu-stack
# Nothing CUDA-only: MPI is the mpich wheel constraints.txt pins, mpi4py's wheel finds it. MPICH takes
# its ranks' wiring from srun through PMI-2 (the sbatch scripts read this to pick srun --mpi).
ENV REPROFLOW_SRUN_MPI=pmi2

FROM python AS gpu-stack
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG PYTHON
# Every source below is pinned by commit (git) or sha256 (a release tarball) and taken by fetch-source: from
# the source mirror folder make containers mounts at /opt/sources when it has one, else from upstream. The
# pin check (containers/pins.py, run by make test and before every gpu build) holds these to one CUDA.
ARG EFA_INSTALLER_VERSION=1.50.0
ARG LIBFABRIC_VERSION=2.6.0
ARG LIBFABRIC_COMMIT=5de2d6a2df83595bcc38531cb91bf59495559495
ARG GDRCOPY_VERSION=2.6
ARG GDRCOPY_COMMIT=93c606bbcaa10457cbbab93163aa446d902b983d
ARG AWS_OFI_NCCL_VERSION=1.21.1
ARG AWS_OFI_NCCL_COMMIT=2475c4c736907e68ebeadb3848f31231ee4a44d0
# Open MPI's release source as Debian archives it (open-mpi.org's download site is the other copy).
ARG OPENMPI_VERSION=5.0.7
ARG OPENMPI_SHA256=97f10c04e9b9a1771db3fd005009e4c07afa3ce739f940e41eb0fc7397cb9473
# apex's main: no release tag yet builds for CUDA 13 (25.09 and earlier hard-code compute_70).
ARG APEX_COMMIT=6424da3b4faa6c8f062da4a48c424fff3f02d42d
ARG PARAM_COMMIT=6236487e8969838822b52298c2a2318f6ac47bbd
ARG NCCL_TESTS_VERSION=2.19.6
ARG NCCL_TESTS_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
# A100 (p4d) and H100/H200 (p5, p5e)
ARG CUDA_ARCHS="8.0 9.0"
ARG NVCC_GENCODE="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90"
# Parts a build host cannot have, left out by name and recorded in the image (REPROFLOW_IMAGE_SKIPPED) for
# reproflow doctor: efa-installer (libfabric is then built from source in its place, without the EFA
# kernel-side pieces).
ARG SKIP=""
RUN apt-get update \
 && apt-get install -y --no-install-recommends "${PYTHON}-dev" git curl xz-utils bzip2 build-essential autoconf \
        automake libtool pkg-config libhwloc-dev libnuma-dev libibverbs-dev kmod \
 && rm -rf /var/lib/apt/lists/*
COPY containers/fetch-source.sh /usr/local/bin/fetch-source
# One CUDA: apex and DeepSpeed refuse a toolchain other than torch's, and NCCL's package name carries it.
RUN torch_cuda="$(python -c 'import torch; print(torch.version.cuda or "none (a CPU build)")')" \
 && nvcc_cuda="$(nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')" \
 && if [ "$torch_cuda" != "$nvcc_cuda" ]; then \
        echo "torch is built for CUDA $torch_cuda but the base image's nvcc is CUDA $nvcc_cuda:" \
             "choose BASE_IMAGE and TORCH_INDEX_URL of one CUDA version (containers/pins.py)" >&2; exit 1; fi
# GDRCopy's user library (GPUDirect RDMA copies for NCCL; the gdrdrv module is the host's).
RUN fetch-source /tmp/gdrcopy "${GDRCOPY_COMMIT}" https://github.com/NVIDIA/gdrcopy.git \
 && make -C /tmp/gdrcopy -j "$(nproc)" prefix=/opt/gdrcopy CUDA=/usr/local/cuda lib lib_install \
 && rm -rf /tmp/gdrcopy
# EFA: libfabric and its EFA provider from AWS's installer (the kernel module is the host's). Without it,
# libfabric at the installer's release, built from source with the EFA provider, at the same prefix.
# hadolint ignore=DL3003
RUN case " ${SKIP} " in *" efa-installer "*) \
        fetch-source /tmp/libfabric "${LIBFABRIC_COMMIT}" https://github.com/ofiwg/libfabric.git \
        && cd /tmp/libfabric && ./autogen.sh >/dev/null \
        && ./configure --prefix=/opt/amazon/efa --enable-efa --with-cuda=/usr/local/cuda --enable-cuda-dlopen \
               --with-gdrcopy=/opt/gdrcopy --enable-gdrcopy-dlopen --disable-verbs --disable-psm3 >/dev/null \
        && make -j "$(nproc)" install >/dev/null && rm -rf /tmp/libfabric ;; \
    *) curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
            | tar -xz -C /tmp \
        && cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
        && rm -rf /tmp/aws-efa-installer ;; \
    esac \
 && /opt/amazon/efa/bin/fi_info --version
# NCCL is the release torch's own wheel brings (nvidia-nccl-cu<major>): nccl-tests and the OFI plugin build
# against the library torch runs with, in /opt/nccl as a NCCL install lays it out.
RUN cuda_major="$(python -c 'import torch; print(torch.version.cuda.split(".")[0])')" \
 && pip show "nvidia-nccl-cu${cuda_major}" | grep '^Version:' \
 && nccl="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/nccl" \
 && mkdir -p /opt/nccl/lib && ln -s "$nccl/include" /opt/nccl/include \
 && ln -s "$nccl/lib/libnccl.so.2" /opt/nccl/lib/libnccl.so.2 && ln -s libnccl.so.2 /opt/nccl/lib/libnccl.so
# The OFI plugin that takes NCCL over EFA (its autogen reads the version from git, or from .release_version
# in a source without git's history).
# hadolint ignore=DL3003
RUN fetch-source /tmp/ofi "${AWS_OFI_NCCL_COMMIT}" https://github.com/aws/aws-ofi-nccl.git \
 && cd /tmp/ofi && echo "${AWS_OFI_NCCL_VERSION}" > .release_version && ./autogen.sh >/dev/null \
 && ./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
        --enable-platform-aws --disable-tests >/dev/null \
 && make -j "$(nproc)" >/dev/null && make install >/dev/null && rm -rf /tmp/ofi
# CUDA-aware Open MPI over libfabric: MPI4DL's halo exchange sends device buffers. Its CUDA support links
# libcuda: the base image's stub (lib64/stubs); the node's driver provides the library at run time.
# hadolint ignore=DL3003
RUN fetch-source /tmp/openmpi "sha256:${OPENMPI_SHA256}" \
        "http://deb.debian.org/debian/pool/main/o/openmpi/openmpi_${OPENMPI_VERSION}.orig.tar.xz" \
 && cd /tmp/openmpi \
 && ./configure --prefix=/opt/openmpi --with-cuda=/usr/local/cuda --with-cuda-libdir=/usr/local/cuda/lib64/stubs \
        --with-ofi=/opt/amazon/efa --with-slurm --disable-mpi-fortran >/dev/null \
 && make -j "$(nproc)" install >/dev/null && rm -rf /tmp/openmpi
ENV PATH=/opt/openmpi/bin:/opt/amazon/efa/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/openmpi/lib:/opt/nccl/lib:/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/opt/gdrcopy/lib:${LD_LIBRARY_PATH} \
    FI_PROVIDER=efa NCCL_NET_PLUGIN=ofi
# mpi4py at the locked version, built against that Open MPI instead of the mpich wheel.
RUN pip uninstall -y mpich \
 && MPICC=/opt/openmpi/bin/mpicc pip install --no-binary mpi4py --force-reinstall --no-deps mpi4py \
 && ompi_info --parsable --all | grep -q "mpi_built_with_cuda_support:value:true"
# That Open MPI reads GPU memory, so spatial parallelism's halo exchange hands it CUDA tensors; it takes
# its ranks' wiring from srun through PMIx (the sbatch scripts read this to pick srun --mpi).
ENV REPROFLOW_MPI_CUDA_AWARE=1 REPROFLOW_SRUN_MPI=pmix
# NVIDIA apex with its C++ and CUDA extensions (Megatron-LM's fused kernels), then DeepSpeed (the locked
# version) rebuilt with its fused Adam and CPU Adam ops.
RUN fetch-source /tmp/apex "${APEX_COMMIT}" https://github.com/NVIDIA/apex.git \
 && APEX_CPP_EXT=1 APEX_CUDA_EXT=1 TORCH_CUDA_ARCH_LIST="${CUDA_ARCHS}" MAX_JOBS="$(nproc)" \
        pip install --no-build-isolation /tmp/apex \
 && python -c "import apex, fused_layer_norm_cuda" && rm -rf /tmp/apex \
 && DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 TORCH_CUDA_ARCH_LIST="${CUDA_ARCHS}" \
        pip install --no-build-isolation --no-binary deepspeed --force-reinstall --no-deps deepspeed
# param at the commit the AWS recipe pins (its comms.py and driver.py run beside reproflow's), and
# nccl-tests against the same NCCL and MPI.
RUN fetch-source /opt/param "${PARAM_COMMIT}" https://github.com/facebookresearch/param.git \
 && fetch-source /opt/nccl-tests "${NCCL_TESTS_COMMIT}" https://github.com/NVIDIA/nccl-tests.git \
 && make -C /opt/nccl-tests -j "$(nproc)" MPI=0 NCCL_HOME=/opt/nccl \
        CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${NVCC_GENCODE}" \
 && make -C /opt/nccl-tests -j "$(nproc)" MPI=1 NAME_SUFFIX=_mpi MPI_HOME=/opt/openmpi NCCL_HOME=/opt/nccl \
        CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${NVCC_GENCODE}"
# Enroot (and Pyxis through it) starts processes with the caller's PATH, not the image's: Open MPI's and
# libfabric's tools are linked into /usr/local/bin, the virtual environment's, which every PATH has.
RUN ln -s /opt/openmpi/bin/* /opt/amazon/efa/bin/* /usr/local/bin/
ENV PARAM_DIR=/opt/param PARAM_COMMIT=${PARAM_COMMIT} NCCL_TESTS_DIR=/opt/nccl-tests/build \
    REPROFLOW_IMAGE_SKIPPED=${SKIP}

# hadolint ignore=DL3006
FROM ${STACK} AS image
COPY . /opt/reproflow
# No build isolation: the venv's own setuptools builds the editable install, nothing is fetched.
RUN pip install --no-deps --no-build-isolation -e /opt/reproflow && reproflow --version
ARG REPROFLOW_GIT_COMMIT=unknown
ENV REPROFLOW_GIT_COMMIT=${REPROFLOW_GIT_COMMIT} REPROFLOW_ROOT=/opt/reproflow
WORKDIR /opt/reproflow
# `enroot import` makes a container of the image first (docker/podman create), which needs a command;
# Pyxis and the other runtimes give each step its own.
CMD ["/bin/bash"]
