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
ARG BASE_IMAGE=nvidia/cuda:12.9.1-cudnn-devel-ubuntu22.04
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
# torch's CUDA build (2.13.0+cu129 outranks PyPI's 2.13.0 for the same pin). PIP_NO_INDEX=1 (the cpu
# flavour built by make containers) installs only from /opt/wheels, the wheels it prepared with the
# machine's own pip configuration and mounts there; otherwise /opt/wheels does not exist.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129
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
ARG EFA_INSTALLER_VERSION=1.42.0
ARG AWS_OFI_NCCL_VERSION=v1.16.0
ARG GDRCOPY_VERSION=v2.5
ARG OPENMPI_VERSION=5.0.8
ARG APEX_REF=25.07
ARG PARAM_COMMIT=6236487e8969838822b52298c2a2318f6ac47bbd
ARG NCCL_TESTS_VERSION=v2.19.6
# A100 (p4d) and H100/H200 (p5, p5e)
ARG CUDA_ARCHS="8.0 9.0"
ARG NVCC_GENCODE="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90"
RUN apt-get update \
 && apt-get install -y --no-install-recommends "${PYTHON}-dev" git curl build-essential autoconf automake \
        libtool pkg-config libhwloc-dev libnuma-dev kmod \
 && rm -rf /var/lib/apt/lists/*
# EFA: libfabric and its EFA provider (the kernel module is the host's).
# hadolint ignore=DL3003
RUN curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" | tar -xz -C /tmp \
 && cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
 && rm -rf /tmp/aws-efa-installer
# GDRCopy's user library (GPUDirect RDMA copies for NCCL).
RUN git clone --depth 1 --branch "${GDRCOPY_VERSION}" https://github.com/NVIDIA/gdrcopy.git /tmp/gdrcopy \
 && make -C /tmp/gdrcopy -j "$(nproc)" prefix=/opt/gdrcopy CUDA=/usr/local/cuda lib lib_install \
 && rm -rf /tmp/gdrcopy
# NCCL at exactly the release torch's wheel depends on (nvidia-nccl-cu12), so nccl-tests and torch agree.
RUN NCCL_VERSION="$(pip show nvidia-nccl-cu12 | sed -n 's/^Version: //p')" \
 && git clone --depth 1 --branch "v${NCCL_VERSION}-1" https://github.com/NVIDIA/nccl.git /opt/nccl \
 && make -C /opt/nccl -j "$(nproc)" src.build CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${NVCC_GENCODE}"
# The OFI plugin that takes NCCL over EFA.
# hadolint ignore=DL3003
RUN git clone --depth 1 --branch "${AWS_OFI_NCCL_VERSION}" https://github.com/aws/aws-ofi-nccl.git /tmp/ofi \
 && cd /tmp/ofi && ./autogen.sh \
 && ./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
        --enable-platform-aws --disable-tests \
 && make -j "$(nproc)" && make install && rm -rf /tmp/ofi
# CUDA-aware Open MPI over libfabric: MPI4DL's halo exchange sends device buffers.
# hadolint ignore=DL3003
RUN curl -fsSL "https://download.open-mpi.org/release/open-mpi/v${OPENMPI_VERSION%.*}/openmpi-${OPENMPI_VERSION}.tar.gz" \
        | tar -xz -C /tmp \
 && cd "/tmp/openmpi-${OPENMPI_VERSION}" \
 && ./configure --prefix=/opt/openmpi --with-cuda=/usr/local/cuda --with-ofi=/opt/amazon/efa --with-slurm \
 && make -j "$(nproc)" install && rm -rf "/tmp/openmpi-${OPENMPI_VERSION}"
ENV PATH=/opt/openmpi/bin:/opt/amazon/efa/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/openmpi/lib:/opt/nccl/build/lib:/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/opt/gdrcopy/lib:${LD_LIBRARY_PATH} \
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
RUN git clone --depth 1 --branch "${APEX_REF}" https://github.com/NVIDIA/apex.git /tmp/apex \
 && APEX_CPP_EXT=1 APEX_CUDA_EXT=1 TORCH_CUDA_ARCH_LIST="${CUDA_ARCHS}" \
        pip install --no-build-isolation /tmp/apex \
 && python -c "import apex, fused_layer_norm_cuda" && rm -rf /tmp/apex \
 && DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1 TORCH_CUDA_ARCH_LIST="${CUDA_ARCHS}" \
        pip install --no-build-isolation --no-binary deepspeed --force-reinstall --no-deps deepspeed
# param at the commit the AWS recipe pins (its comms.py and driver.py run beside reproflow's), and
# nccl-tests against the same NCCL and MPI.
RUN git clone https://github.com/facebookresearch/param.git /opt/param \
 && git -C /opt/param checkout "${PARAM_COMMIT}" && rm -rf /opt/param/.git \
 && git clone --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git /opt/nccl-tests \
 && make -C /opt/nccl-tests -j "$(nproc)" MPI=0 NCCL_HOME=/opt/nccl/build \
        CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${NVCC_GENCODE}" \
 && make -C /opt/nccl-tests -j "$(nproc)" MPI=1 NAME_SUFFIX=_mpi MPI_HOME=/opt/openmpi NCCL_HOME=/opt/nccl/build \
        CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${NVCC_GENCODE}"
ENV PARAM_DIR=/opt/param PARAM_COMMIT=${PARAM_COMMIT} NCCL_TESTS_DIR=/opt/nccl-tests/build

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
